package bench

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is one run: where and when it ran, and what it measured.
type Report struct {
	Date     time.Time `json:"date"`
	Suite    string    `json:"suite"`
	Seconds  float64   `json:"seconds"`
	Machine  Machine   `json:"machine"`
	Postgres Postgres  `json:"postgres"`
	Git      Git       `json:"git"`
	Results  []Result  `json:"results,omitempty"`
	Notes    []Note    `json:"notes,omitempty"`
	// Charts are the chart files written next to the JSON (names only).
	Charts []string `json:"charts,omitempty"`
}

// Slug is the file name stem of the run's outputs: <date>-<machine>.
func (r *Report) Slug() string {
	host := regexp.MustCompile(`[^A-Za-z0-9._-]+`).ReplaceAllString(r.Machine.Hostname, "_")
	if host == "" {
		host = "unknown"
	}
	return r.Date.Format("2006-01-02") + "-" + host
}

// WriteTable prints the results as aligned text tables: the throughput results, then
// the timing-only ones.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\trecords/s\tMB/s\tp50 ms\tp99 ms\tcli µs/rec\tsrv µs/rec\tcpu busy\tratio\ttarget\t")
	for _, res := range r.Results {
		if res.Timing != nil {
			continue
		}
		p50, p99 := "-", "-"
		if res.Latency != nil {
			p50, p99 = fmt.Sprintf("%.2f", res.Latency.P50), fmt.Sprintf("%.2f", res.Latency.P99)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", res.Case, res.RecordsPerSec, res.MBPerSec, p50, p99,
			cpuText(res.ClientCPUPerRecord), cpuText(res.ServerCPUPerRecord), busyText(res.CPUBusy), ratioSpreadText(res), targetText(res))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !r.hasTimings() {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case (timing)\tsamples\tp50 ms\tp99 ms\tmax ms\tmean ms\tratio\t")
	for _, res := range r.Results {
		if t := res.Timing; t != nil {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", res.Case, t.Count, msText(t.P50), msText(t.P99), msText(t.Max), msText(t.Mean), ratioText(res))
		}
	}
	return tw.Flush()
}

func (r *Report) hasTimings() bool {
	for _, res := range r.Results {
		if res.Timing != nil {
			return true
		}
	}
	return false
}

// msText formats milliseconds with three significant digits or more.
func msText(ms float64) string {
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0f", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.2f", ms)
}

func ratioText(r Result) string {
	if r.RatioTo == "" || r.Ratio == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", r.Ratio)
}

func cpuText(us float64) string {
	if us == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", us)
}

func busyText(f float64) string {
	if f == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", f*100)
}

func ratioTargetText(r Result) string {
	rt := ratioSpreadText(r)
	if t := targetText(r); t != "" {
		rt += " (" + t + ")"
	}
	return rt
}

func targetText(r Result) string {
	if r.Target == 0 || r.Ratio == 0 {
		return ""
	}
	if r.Ratio >= r.Target {
		return fmt.Sprintf("≥%.1f ok", r.Target)
	}
	return fmt.Sprintf("<%.1f", r.Target)
}

// WriteJSON writes the report to dir/<slug>.json and returns the path.
func (r *Report) WriteJSON(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Indented, except that each result is one line: small files, readable diffs.
	head := *r
	head.Results = nil
	b, err := json.MarshalIndent(&head, "", " ")
	if err != nil {
		return "", err
	}
	var doc strings.Builder
	doc.Write(bytes.TrimSuffix(bytes.TrimSpace(b), []byte("}")))
	doc.WriteString(",\n \"results\": [\n")
	for i, res := range r.Results {
		line, err := json.Marshal(res)
		if err != nil {
			return "", err
		}
		doc.WriteString("  ")
		doc.Write(line)
		if i < len(r.Results)-1 {
			doc.WriteByte(',')
		}
		doc.WriteByte('\n')
	}
	doc.WriteString(" ]\n}\n")
	path := filepath.Join(dir, r.Slug()+".json")
	return path, os.WriteFile(path, []byte(doc.String()), 0o644)
}

// ReadReport reads a report that WriteJSON wrote.
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return &r, nil
}

// WriteCharts writes the run's SVG charts into dir and records their names.
func (r *Report) WriteCharts(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	r.Charts = nil
	for _, c := range r.charts() {
		name := r.Slug() + "-" + c.file + ".svg"
		if err := os.WriteFile(filepath.Join(dir, name), c.chart.svg(), 0o644); err != nil {
			return err
		}
		r.Charts = append(r.Charts, name)
	}
	return nil
}

type namedChart struct {
	file  string
	chart chart
}

func (r *Report) charts() []namedChart {
	var out []namedChart
	sizes := map[int]bool{}
	for _, res := range r.Results {
		if res.Scenario == "produce" {
			sizes[res.Params.PayloadBytes] = true
		}
	}
	var sizeList []int
	for s := range sizes {
		sizeList = append(sizeList, s)
	}
	slices.Sort(sizeList)
	for _, size := range sizeList {
		// Throughput against batch size, per system and connection count.
		bySeries := map[string][]point{}
		var names []string
		parts := 0
		for _, res := range r.Results {
			if res.Scenario != "produce" || res.Params.Mode != "" || res.Params.PayloadBytes != size {
				continue
			}
			parts = res.Params.Partitions
			name := fmt.Sprintf("%s, %d conn", res.System, res.Params.Conns)
			if _, ok := bySeries[name]; !ok {
				names = append(names, name)
			}
			bySeries[name] = append(bySeries[name], point{float64(res.Params.BatchSize), res.RecordsPerSec})
		}
		c := chart{title: fmt.Sprintf("produce %s: records/s vs batch size (%d partitions)", sizeLabel(size), parts),
			xLabel: "records per transaction (log)", yLabel: "records/s", logX: true, dots: true}
		for _, n := range names {
			c.series = append(c.series, series{name: n, points: bySeries[n], dashed: strings.HasPrefix(n, "copy")})
		}
		out = append(out, namedChart{"produce-batch-" + sizeLabel(size), c})

		// Per-call latency distribution of the streamd cases at the most connections,
		// and of the batching producer.
		lc := chart{title: fmt.Sprintf("produce %s: latency per call (CDF)", sizeLabel(size)),
			xLabel: "ms (log)", yLabel: "fraction of calls", logX: true, yMax: 1,
			yFormat: func(v float64) string { return fmt.Sprintf("%.1f", v) }}
		maxConns := 0
		for _, res := range r.Results {
			if res.Scenario == "produce" && res.System == "streamd" {
				maxConns = max(maxConns, res.Params.Conns)
			}
		}
		for _, res := range r.Results {
			ok := res.Scenario == "produce" && res.System == "streamd" && res.Params.Mode == "" && res.Params.Conns == maxConns
			ok = ok || (res.Scenario == "producer" && res.Params.Mode == "sync")
			if ok && res.Params.PayloadBytes == size && res.Latency != nil {
				name := fmt.Sprintf("%s b=%d c=%d", res.System, res.Params.BatchSize, res.Params.Conns)
				if res.Scenario == "producer" {
					name = fmt.Sprintf("Producer.Produce, %d callers", res.Params.Conns)
				}
				lc.series = append(lc.series, series{name: name, points: cdf(res.Latency)})
			}
		}
		out = append(out, namedChart{"latency-produce-" + sizeLabel(size), lc})
	}

	// Throughput against partitions.
	pc := chart{title: "produce: records/s vs partitions", xLabel: "partitions (log)", yLabel: "records/s", logX: true, dots: true}
	bySys := map[string][]point{}
	var sysNames []string
	for _, res := range r.Results {
		if res.Scenario == "produce" && res.Params.Mode == "sweep" {
			name := fmt.Sprintf("%s %s b=%d c=%d", res.System, sizeLabel(res.Params.PayloadBytes), res.Params.BatchSize, res.Params.Conns)
			if _, ok := bySys[name]; !ok {
				sysNames = append(sysNames, name)
			}
			bySys[name] = append(bySys[name], point{float64(res.Params.Partitions), res.RecordsPerSec})
		}
	}
	for _, n := range sysNames {
		pc.series = append(pc.series, series{name: n, points: bySys[n], dashed: strings.HasPrefix(n, "copy")})
	}
	if len(sysNames) > 0 {
		out = append(out, namedChart{"produce-partitions", pc})
	}

	// Fetch latency distributions.
	fc := chart{title: "fetch: latency per fetch call (CDF)", xLabel: "ms (log)", yLabel: "fraction of calls",
		logX: true, yMax: 1, yFormat: func(v float64) string { return fmt.Sprintf("%.1f", v) }}
	for _, res := range r.Results {
		if res.Scenario == "fetch" && res.Latency != nil {
			fc.series = append(fc.series, series{name: fmt.Sprintf("%s %s b=%d", res.System, sizeLabel(res.Params.PayloadBytes), res.Params.BatchSize),
				points: cdf(res.Latency), dashed: res.Baseline})
		}
	}
	if len(fc.series) > 0 {
		out = append(out, namedChart{"latency-fetch", fc})
	}
	if c, ok := r.seriesChart("queue", func(res Result) (string, float64, bool) { return res.System, float64(res.Params.Conns), true },
		chart{title: "queue: messages/s vs workers (send + drain, batches of 100)", xLabel: "workers (log)", yLabel: "messages/s", logX: true, dots: true}); ok {
		out = append(out, namedChart{"queue-workers", c})
	}
	if c, ok := r.seriesChart("growth", func(res Result) (string, float64, bool) {
		return res.System, float64(res.Params.LogEvents) / 1e6, !strings.HasPrefix(res.System, "load-")
	}, chart{title: "growth: records/s vs events already in the log", xLabel: "millions of events in streamd.events", yLabel: "records/s", dots: true}); ok {
		out = append(out, namedChart{"growth", c})
	}
	return out
}

// seriesChart draws scenario's throughput results as one series per name that pick
// returns (baselines dashed), at x; pick's false leaves a result out.
func (r *Report) seriesChart(scenario string, pick func(Result) (name string, x float64, ok bool), c chart) (chart, bool) {
	points := map[string][]point{}
	dashed := map[string]bool{}
	var names []string
	for _, res := range r.Results {
		if res.Scenario != scenario || res.Timing != nil {
			continue
		}
		name, x, ok := pick(res)
		if !ok {
			continue
		}
		if _, seen := points[name]; !seen {
			names = append(names, name)
		}
		points[name] = append(points[name], point{x, res.RecordsPerSec})
		dashed[name] = res.Baseline
	}
	for _, n := range names {
		pts := points[n]
		slices.SortFunc(pts, func(a, b point) int { return cmp.Compare(a.x, b.x) })
		c.series = append(c.series, series{name: n, points: pts, dashed: dashed[n]})
	}
	return c, len(names) > 0
}

const (
	generatedBegin = "<!-- generated:begin (bench/cmd/streamd-bench rewrites this section) -->"
	generatedEnd   = "<!-- generated:end -->"
)

// UpdateResultsMD rewrites the generated section of the markdown file at path (between
// the generated markers; appended when they are missing) with this run. chartDir is
// the charts' directory relative to the markdown file.
func (r *Report) UpdateResultsMD(path, chartDir string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(old)
	gen := generatedBegin + "\n" + r.Markdown(chartDir) + generatedEnd + "\n"
	i, j := strings.Index(doc, generatedBegin), strings.Index(doc, generatedEnd)
	if i >= 0 && j > i {
		doc = doc[:i] + gen + strings.TrimPrefix(doc[j+len(generatedEnd):], "\n")
	} else {
		if doc != "" && !strings.HasSuffix(doc, "\n") {
			doc += "\n"
		}
		doc += "\n" + gen
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}

// Markdown renders the run: headline ratios, machine, settings, the table, notes
// and charts.
func (r *Report) Markdown(chartDir string) string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "## Latest run: %s, suite %s\n\n", r.Date.Format("2006-01-02 15:04 MST"), r.Suite)
	fmt.Fprintf(&b, "- Machine: `%s`, %s, %d cores, %.1f GB RAM, kernel %s, %s\n", m.Hostname, m.CPUModel, m.Cores, m.MemoryGB, m.Kernel, m.GoVersion)
	fmt.Fprintf(&b, "- Load average (1 min) at start %.2f, at end %.2f (other work on the machine skews the figures)\n", m.LoadAvgStart, m.LoadAvgEnd)
	dirty := ""
	if r.Git.Dirty {
		dirty = " (with uncommitted changes in bench/, streams/ or sql/)"
	}
	fmt.Fprintf(&b, "- Commit `%s`%s; the run took %.0f s\n", short(r.Git.Commit), dirty, r.Seconds)
	fmt.Fprintf(&b, "- PostgreSQL %s:", r.Postgres.Version)
	for _, k := range settingNames {
		if v, ok := r.Postgres.Settings[k]; ok {
			fmt.Fprintf(&b, " %s=%s", k, v)
		}
	}
	b.WriteString("\n\n")

	if hs := r.headlines(); len(hs) > 0 {
		b.WriteString("### Targets\n\n")
		b.WriteString("Each target at the one configuration it names, against its baseline measured back to back with it in the same scenario; the median of the repeats and their spread. A best case of another configuration is shown beside it only for comparison.\n\n")
		for _, h := range hs {
			b.WriteString("- " + h + "\n")
		}
		b.WriteString("\n")
	}

	b.WriteString("### All results\n\n")
	b.WriteString("MB/s counts payload bytes (JSON data plus key). Latency is per operation: one produce call (a batch), one `Producer.Produce` (one record), one fetch call. CPU per record: the benchmark process (client) and its PostgreSQL backends (server); CPU busy: both over wall time and all cores (the WAL writer, checkpointer and other processes not counted).\n\n")
	b.WriteString("| case | records/s | MB/s | p50 ms | p99 ms | client CPU µs/rec | server CPU µs/rec | CPU busy | ratio | vs |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, res := range r.Results {
		if res.Timing != nil {
			continue
		}
		p50, p99 := "", ""
		if res.Latency != nil {
			p50, p99 = fmt.Sprintf("%.2f", res.Latency.P50), fmt.Sprintf("%.2f", res.Latency.P99)
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.2f | %s | %s | %s | %s | %s | %s | %s |\n", res.Case, res.RecordsPerSec, res.MBPerSec, p50, p99,
			cpuText(res.ClientCPUPerRecord), cpuText(res.ServerCPUPerRecord), busyText(res.CPUBusy), ratioTargetText(res), res.RatioTo)
	}
	b.WriteString("\n")
	for _, res := range r.Results {
		if res.Note != "" && res.Timing == nil {
			fmt.Fprintf(&b, "- *%s*: %s\n", res.Case, res.Note)
		}
	}
	b.WriteString("\n")
	if r.hasTimings() {
		b.WriteString("### Timings\n\n")
		b.WriteString("Cases that time an operation rather than move records; \"one sample\" says what each sample times. The ratio is the baseline's median over the case's (above 1: faster than the baseline).\n\n")
		b.WriteString("| case | one sample | samples | p50 ms | p99 ms | max ms | mean ms | ratio | vs |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n")
		for _, res := range r.Results {
			if t := res.Timing; t != nil {
				fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", res.Case, t.Op, t.Count,
					msText(t.P50), msText(t.P99), msText(t.Max), msText(t.Mean), ratioTargetText(res), res.RatioTo)
			}
		}
		b.WriteString("\n")
		for _, res := range r.Results {
			if res.Note != "" && res.Timing != nil {
				fmt.Fprintf(&b, "- *%s*: %s\n", res.Case, res.Note)
			}
		}
		b.WriteString("\n")
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "### %s\n\n%s\n", n.Title, n.Text)
	}
	if len(r.Charts) > 0 {
		b.WriteString("### Charts\n\n")
		for _, c := range r.Charts {
			fmt.Fprintf(&b, "![%s](%s)\n\n", strings.TrimSuffix(c, ".svg"), filepath.ToSlash(filepath.Join(chartDir, c)))
		}
	}
	return b.String()
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}
