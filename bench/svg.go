package bench

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"slices"
	"strconv"
)

// A hand-written SVG line chart: enough for throughput curves and latency CDFs,
// without a plotting dependency.

type point struct{ x, y float64 }

type series struct {
	name   string
	points []point
	dashed bool
}

type chart struct {
	title, xLabel, yLabel string
	logX                  bool
	// yMax fixes the y axis top (0: from the data).
	yMax float64
	// dots marks each data point (for measured points, not for distributions).
	dots bool
	// yFormat formats y tick labels (nil: SI-style 12k, 1.2M).
	yFormat func(float64) string
	series  []series
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

const (
	svgW, svgH                         = 720, 400
	padLeft, padRight, padTop, padBott = 70, 20, 40, 50
)

// svg renders the chart.
func (c chart) svg() []byte {
	var xs []float64
	yMax := c.yMax
	for _, s := range c.series {
		for _, p := range s.points {
			xs = append(xs, p.x)
			if c.yMax == 0 {
				yMax = max(yMax, p.y)
			}
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgW, svgH)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", padLeft, html.EscapeString(c.title))
	if len(xs) == 0 {
		b.WriteString(`<text x="300" y="200">no data</text></svg>` + "\n")
		return b.Bytes()
	}
	slices.Sort(xs)
	xs = slices.Compact(xs)
	xMin, xMax := xs[0], xs[len(xs)-1]
	tx := func(x float64) float64 { return x }
	if c.logX {
		xMin, xMax = math.Max(xMin, 1e-9), math.Max(xMax, 1e-9)
		tx = func(x float64) float64 { return math.Log10(math.Max(x, 1e-9)) }
	}
	lo, hi := tx(xMin), tx(xMax)
	if hi == lo {
		lo, hi = lo-1, hi+1
	}
	yTop := niceCeil(yMax)
	if yTop <= 0 {
		yTop = 1
	}
	plotW, plotH := float64(svgW-padLeft-padRight), float64(svgH-padTop-padBott)
	px := func(x float64) float64 { return padLeft + (tx(x)-lo)/(hi-lo)*plotW }
	py := func(y float64) float64 { return padTop + plotH - y/yTop*plotH }

	// Axes and grid.
	fmt.Fprintf(&b, `<g stroke="#ccc" stroke-width="1">`+"\n")
	for i := 0; i <= 5; i++ {
		y := yTop * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`+"\n", padLeft, py(y), svgW-padRight, py(y))
	}
	b.WriteString("</g>\n")
	yFmt := c.yFormat
	if yFmt == nil {
		yFmt = siFormat
	}
	for i := 0; i <= 5; i++ {
		y := yTop * float64(i) / 5
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padLeft-6, py(y)+4, yFmt(y))
	}
	for _, x := range xTicks(xs, c.logX, xMin, xMax) {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999"/>`+"\n", px(x), svgH-padBott, px(x), svgH-padBott+4)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px(x), svgH-padBott+16, strconv.FormatFloat(x, 'g', 4, 64))
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", padLeft, svgH-padBott, svgW-padRight, svgH-padBott)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", padLeft, padTop, padLeft, svgH-padBott)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", padLeft+plotW/2, svgH-12, html.EscapeString(c.xLabel))
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n", padTop+plotH/2, padTop+plotH/2, html.EscapeString(c.yLabel))

	// Series and legend.
	for i, s := range c.series {
		color := palette[i%len(palette)]
		var pts bytes.Buffer
		for j, p := range s.points {
			if j > 0 {
				pts.WriteByte(' ')
			}
			fmt.Fprintf(&pts, "%.1f,%.1f", px(p.x), py(math.Min(p.y, yTop)))
		}
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6 3"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, pts.String())
		if c.dots {
			for _, p := range s.points {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(p.x), py(math.Min(p.y, yTop)), color)
			}
		}
		ly := padTop + 8 + 15*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", padLeft+10, ly, padLeft+30, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", padLeft+36, ly+4, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// xTicks returns the data's x values when there are few, else decades (log) or five
// even steps.
func xTicks(xs []float64, logX bool, lo, hi float64) []float64 {
	if len(xs) <= 10 {
		return xs
	}
	var out []float64
	if logX {
		for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
			if v := math.Pow(10, e); v >= lo && v <= hi {
				out = append(out, v)
			}
		}
		return out
	}
	for i := 0; i <= 5; i++ {
		out = append(out, lo+(hi-lo)*float64(i)/5)
	}
	return out
}

// niceCeil rounds v up to 1, 2, 2.5 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 0
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

func siFormat(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// cdf turns a latency histogram into points of a cumulative distribution.
func cdf(l *Latency) []point {
	if l == nil || l.Count == 0 {
		return nil
	}
	var out []point
	var cum int64
	for i, bk := range l.Hist {
		if i == 0 {
			out = append(out, point{bk.LeMs / math.Pow(10, 1.0/bucketsPerDecade), 0})
		}
		cum += bk.Count
		out = append(out, point{bk.LeMs, float64(cum) / float64(l.Count)})
	}
	return out
}
