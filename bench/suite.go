package bench

import (
	"fmt"
	"time"
)

// Suite holds the sizes a run measures at. Throughput cases run for CaseDuration each
// (time-bounded rather than count-bounded, so that slow cases such as one-record
// transactions do not dominate the run time).
type Suite struct {
	// Name is "quick", "full" or "tiny".
	Name string `json:"name"`
	// CaseDuration is how long each throughput case runs (at least: a case that moves
	// a fixed count repeats until it has run this long).
	CaseDuration time.Duration `json:"case_duration"`
	// Repeats is how many times each scenario runs; every result is the median
	// repeat, with the spread of the repeats beside it. Scenarios whose cost is a
	// large setup (growth) run once.
	Repeats int `json:"repeats"`
	// Payloads are the JSON payload sizes in bytes.
	Payloads []int `json:"payloads"`
	// BatchSizes are the records per produce call (and per COPY).
	BatchSizes []int `json:"batch_sizes"`
	// Conns are the numbers of producer connections (goroutines).
	Conns []int `json:"conns"`
	// Partitions is the partition count of the produce streams.
	Partitions int `json:"partitions"`
	// PartitionSweep are the partition counts of the throughput-vs-partitions cases,
	// run at SweepBatch records per call with the largest of Conns.
	PartitionSweep []int `json:"partition_sweep"`
	SweepBatch     int   `json:"sweep_batch"`
	// ProducerCallers are the numbers of goroutines calling streams.Producer.Produce.
	ProducerCallers []int `json:"producer_callers"`
	// FetchRecords is the size of the fetched partition, per payload size.
	FetchRecords map[int]int `json:"fetch_records"`
	// FetchBatch is the records per fetch.
	FetchBatch int `json:"fetch_batch"`
	// ProfileIterations is how many batches each profile stage appends.
	ProfileIterations int `json:"profile_iterations"`
	// ProfileBatch is the records per profiled batch.
	ProfileBatch int `json:"profile_batch"`
	// QueueWorkers are the numbers of concurrent queue workers (and of raw drainers).
	QueueWorkers []int `json:"queue_workers"`
	// QueueMessages is how many messages each queue case sends and drains.
	QueueMessages int `json:"queue_messages"`
	// GrowthLogEvents are the sizes of the log (events already in streamd.events) at
	// which the growth scenario measures produce and fetch, ascending.
	GrowthLogEvents []int64 `json:"growth_log_events"`
	// LatencyDuration is how long each latency mode runs; 0 leaves the latency
	// scenario out of the suite.
	LatencyDuration time.Duration `json:"latency_duration,omitempty"`
	// KafkaLatencyDuration is how long each of the kafka scenario's end-to-end modes
	// runs (native group and franz-go group, 1,000 events/s through the tailer); 0
	// leaves them out.
	KafkaLatencyDuration time.Duration `json:"kafka_latency_duration,omitempty"`
}

// QuickSuite is `make bench`: its produce, producer, appendpath, fetch and profile
// scenarios take about two and a half minutes on a 2-core machine (batch size 10 is
// left to the full suite to leave room for the other scenarios). The latency
// scenario is left to the full suite and `make bench-latency`; the latency target's
// case (its group-tailer mode) is the kafka scenario's, which runs it for
// KafkaLatencyDuration.
func QuickSuite() Suite {
	return Suite{
		Name:              "quick",
		CaseDuration:      2 * time.Second,
		Repeats:           3,
		Payloads:          []int{100, 1024},
		BatchSizes:        []int{1, 100, 1000},
		Conns:             []int{1, 4},
		Partitions:        4,
		PartitionSweep:    []int{1, 2, 4, 8},
		SweepBatch:        100,
		ProducerCallers:   []int{16, 256},
		FetchRecords:      map[int]int{100: 200_000, 1024: 100_000},
		FetchBatch:        500,
		ProfileIterations: 20,
		ProfileBatch:      1000,
		QueueWorkers:      []int{1, 4, 16},
		QueueMessages:     20_000,
		GrowthLogEvents:   []int64{0, 500_000},
		// Needs wal_level=logical (the tailer); a quiet server creates its slot at once.
		// 15 s: a tail reader reaches its memory bound after about 4 s at this rate, and
		// a case that ends before it measures a start-up, not what a consumer that runs
		// for hours sees (session 15, kafka17).
		KafkaLatencyDuration: 15 * time.Second,
	}
}

// FullSuite is `make bench-full`: longer cases and larger logs.
func FullSuite() Suite {
	s := QuickSuite()
	s.Name = "full"
	s.CaseDuration = 10 * time.Second
	s.BatchSizes = []int{1, 10, 100, 500, 1000, 5000}
	s.Conns = []int{1, 2, 4, 8}
	s.PartitionSweep = []int{1, 2, 4, 8, 16}
	s.ProducerCallers = []int{1, 16, 256, 1024}
	s.FetchRecords = map[int]int{100: 1_000_000, 1024: 500_000}
	s.ProfileIterations = 100
	s.QueueWorkers = []int{1, 2, 4, 8, 16}
	s.QueueMessages = 100_000
	s.GrowthLogEvents = []int64{0, 10_000_000, 50_000_000}
	s.LatencyDuration = 20 * time.Second
	s.KafkaLatencyDuration = 20 * time.Second
	return s
}

// TinySuite runs every scenario at a size that only proves the harness works (the
// package test uses it).
func TinySuite() Suite {
	return Suite{
		Name:         "tiny",
		CaseDuration: 150 * time.Millisecond,
		// Two, so that the harness's repeat path runs in the package test.
		Repeats:           2,
		Payloads:          []int{100},
		BatchSizes:        []int{1, 50},
		Conns:             []int{1, 2},
		Partitions:        2,
		PartitionSweep:    []int{1, 2},
		SweepBatch:        20,
		ProducerCallers:   []int{4},
		FetchRecords:      map[int]int{100: 1200},
		FetchBatch:        500,
		ProfileIterations: 2,
		ProfileBatch:      50,
		QueueWorkers:      []int{1, 2},
		QueueMessages:     1000,
		// Two sizes above 0, so that a kept ballast of 4000 from an earlier run
		// makes the smaller ones take the temporary database (growth_scenario.go).
		GrowthLogEvents: []int64{0, 2000, 4000},
		// The latency scenario needs a replication slot, whose creation waits on the
		// shared test cluster's constant writes: TestLatencyScenario runs it on a
		// private cluster instead.
		LatencyDuration: 0,
		// Likewise the kafka scenario's end-to-end modes (TestKafkaScenarioEndToEnd).
		KafkaLatencyDuration: 0,
	}
}

// SuiteByName returns the suite called name.
func SuiteByName(name string) (Suite, error) {
	switch name {
	case "quick":
		return QuickSuite(), nil
	case "full":
		return FullSuite(), nil
	case "tiny":
		return TinySuite(), nil
	}
	return Suite{}, fmt.Errorf("unknown suite %q: use quick, full or tiny", name)
}

// maxInt returns the largest of xs (0 for none).
func maxInt(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
