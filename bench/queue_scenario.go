package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/queuebaseline"
	"github.com/streamd/streamd/messages"
)

// queueScenario measures the visibility-timeout queue (package messages) against a
// raw SKIP LOCKED drain of a plain table with the same number of workers, in the same
// run. Its shape is BenchmarkQueueThroughput's (messages/bench_test.go), with the same
// payloads and the same raw statements: per case, one goroutine sends QueueMessages
// messages in batches of queueBatch, then W workers drain them, each until it finds
// nothing left:
//
//   - streamd: Client.Send; each worker calls Client.Receive (Max queueBatch), then
//     Client.Ack with the batch's receipts;
//   - streamd-ack-with-receive: the same, but each worker acks its batch with its next
//     Receive (ReceiveOpts.Ack: one round trip and one transaction for both; the last,
//     empty receive acks the last batch);
//   - pgmq-batched: pgmq's table (msg_id, read_ct, enqueued_at, vt indexed, message)
//     and its batched calls: a read of queueBatch rows (UPDATE of vt ... SKIP LOCKED
//     RETURNING, pgmq's read with qty), then a delete by id array.
//     It is the leanest queue with a lease that outlives the receiving transaction,
//     for comparison (no target of its own);
//   - raw-skip-locked: INSERT ... SELECT FROM unnest($1::text[]) into a table (id
//     bigserial primary key, payload jsonb, created_at timestamptz default now()),
//     drained with DELETE ... RETURNING, which hands each payload to its worker.
//
// The baselines' statements are internal/queuebaseline's, which
// BenchmarkQueueThroughput runs too.
//
// Messages/s is end to end: the messages over the send plus the drain time; the note
// gives both phases. The systems run in an order that rotates with the worker count
// and the repetition, so that background load hits all of them, and each case is
// followed by a VACUUM of its table (outside the timing), so that every case starts
// from the same state. Latency is one drain operation that returned messages: receive
// and ack; one receive carrying the previous batch's acks; one DELETE.
type queueScenario struct{}

func init() { register(55, queueScenario{}) }

func (queueScenario) Name() string { return "queue" }

const (
	// queueBatch is the messages per send and the most per receive.
	queueBatch = 100
	// queueTarget is issue 4's goal: the queue at 0.5× the raw SKIP LOCKED drain.
	queueTarget = 0.5
	// queueMaxRotations bounds the repetitions a case makes to reach the suite's
	// case duration.
	queueMaxRotations = 20
)

// queueSystems: the reference (raw-skip-locked) is last.
var queueSystems = []string{"streamd", "streamd-ack-with-receive", "pgmq-batched", "raw-skip-locked"}

// queuePayloads are BenchmarkQueueThroughput's payloads: message i of every batch
// carries payload i.
func queuePayloads() []string {
	out := make([]string, queueBatch)
	for i := range out {
		out[i] = fmt.Sprintf(`{"order":%d,"customer":"c-%d","amount":%d.5}`, i, i%97, i)
	}
	return out
}

// queueCase is what one case measured.
type queueCase struct {
	load    loadResult
	send    time.Duration
	samples []time.Duration
}

func (s queueScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	su := env.Suite
	n := max(su.QueueMessages/queueBatch, 1) * queueBatch
	reps := bySuite(env, 1, 1, 2)
	client, err := messages.NewClient(env.Pool, &messages.ClientConfig{Logger: quietLogger})
	if err != nil {
		return nil, err
	}
	queue := env.StreamName("queue")
	if err := client.CreateQueue(ctx, queue, nil); err != nil {
		return nil, err
	}
	defer func() { _ = client.DeleteQueue(context.WithoutCancel(ctx), queue) }()
	raw := pgx.Identifier{"streamd_bench", "queue_raw_" + env.RunID}.Sanitize()
	// The schema is the baseline's (setupBaselineSchema); this scenario may run first.
	if _, err := env.Pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS streamd_bench`); err != nil {
		return nil, fmt.Errorf("queue: schema: %w", err)
	}
	if _, err := env.Pool.Exec(ctx, fmt.Sprintf(queuebaseline.RawTable, raw)); err != nil {
		return nil, fmt.Errorf("queue: raw table: %w", err)
	}
	defer func() { _, _ = env.Pool.Exec(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+raw) }()
	pgmq := pgx.Identifier{"streamd_bench", "queue_pgmq_" + env.RunID}.Sanitize()
	if _, err := env.Pool.Exec(ctx, fmt.Sprintf(queuebaseline.PgmqTable, pgmq)); err != nil {
		return nil, fmt.Errorf("queue: pgmq table: %w", err)
	}
	defer func() { _, _ = env.Pool.Exec(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+pgmq) }()
	q := &queueRun{env: env, client: client, queue: queue, raw: raw, pgmq: pgmq, n: n, payloads: queuePayloads()}

	totals := make([][]queueCase, len(su.QueueWorkers))
	for wi := range totals {
		totals[wi] = make([]queueCase, len(queueSystems))
	}
	// Repeat the rotation until every case has run for the suite's case duration
	// (a quick case of 20,000 messages drains in a fraction of a second), with at
	// least reps rotations and at most queueMaxRotations.
	longEnough := func() bool {
		for wi := range totals {
			for si := range totals[wi] {
				if totals[wi][si].load.elapsed < su.CaseDuration {
					return false
				}
			}
		}
		return true
	}
	rotations := 0
	for rep := 0; rep < reps || (!longEnough() && rep < queueMaxRotations); rep++ {
		rotations++
		for wi, w := range su.QueueWorkers {
			for j := range queueSystems {
				si := (wi + rep + j) % len(queueSystems)
				c, err := q.run(ctx, queueSystems[si], w)
				if err != nil {
					return nil, fmt.Errorf("queue %s w=%d: %w", queueSystems[si], w, err)
				}
				env.Logger.Info("queue rep", "system", queueSystems[si], "workers", w, "rep", rep,
					"msgs_per_sec", int(float64(c.load.records)/c.load.elapsed.Seconds()))
				t := &totals[wi][si]
				t.load.records += c.load.records
				t.load.bytes += c.load.bytes
				t.load.elapsed += c.load.elapsed
				t.load.clientCPU += c.load.clientCPU
				t.load.serverCPU += c.load.serverCPU
				t.send += c.send
				t.samples = append(t.samples, c.samples...)
			}
		}
	}

	var out []Result
	for wi, w := range su.QueueWorkers {
		var group []Result
		for si, system := range queueSystems {
			t := totals[wi][si]
			t.load.latency = summarize(t.samples)
			r := loadToResult("queue", system, system == "raw-skip-locked", Params{BatchSize: queueBatch, Conns: w}, t.load)
			r.Case = fmt.Sprintf("queue %s b=%d w=%d", system, queueBatch, w)
			drain := t.load.elapsed - t.send
			r.Note = fmt.Sprintf("%d messages × %d repetition(s); send (1 goroutine) %.0f msgs/s, drain (%d worker(s)) %.0f msgs/s",
				n, rotations, float64(t.load.records)/t.send.Seconds(), w, float64(t.load.records)/drain.Seconds())
			env.Logger.Info("case", "case", r.Case, "msgs_per_sec", int(r.RecordsPerSec))
			group = append(group, r)
		}
		ref := group[len(group)-1].Case
		for i := range group[:len(group)-1] {
			group[i].RatioTo, group[i].Ratio = ref, ratio(group[i].RecordsPerSec, group[len(group)-1].RecordsPerSec)
			if strings.HasPrefix(group[i].System, "streamd") {
				group[i].Target = queueTarget
			}
		}
		out = append(out, group...)
	}
	return out, nil
}

// queueRun holds what the scenario's cases share.
type queueRun struct {
	env      *Env
	client   *messages.Client
	queue    string
	raw      string // the raw table, quoted
	pgmq     string // the pgmq-style table, quoted
	n        int
	payloads []string
}

// run sends q.n messages through system, drains them with workers goroutines, checks
// that every one came back, and vacuums the system's table.
func (q *queueRun) run(ctx context.Context, system string, workers int) (queueCase, error) {
	env := q.env
	msgs := make([]messages.OutgoingMessage, queueBatch)
	for i := range msgs {
		msgs[i] = messages.OutgoingMessage{Data: json.RawMessage(q.payloads[i])}
	}

	before := sampleCPU(ctx, env)
	start := time.Now()
	for range q.n / queueBatch {
		var err error
		switch system {
		case "raw-skip-locked":
			err = queuebaseline.Send(ctx, env.Pool, queuebaseline.RawSend, q.raw, q.payloads)
		case "pgmq-batched":
			err = queuebaseline.Send(ctx, env.Pool, queuebaseline.PgmqSend, q.pgmq, q.payloads)
		default:
			_, err = q.client.Send(ctx, q.queue, msgs...)
		}
		if err != nil {
			return queueCase{}, fmt.Errorf("send: %w", err)
		}
	}
	send := time.Since(start)

	type workerOut struct {
		msgs, bytes int64
		samples     []time.Duration
		err         error
	}
	outs := make([]workerOut, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() { // owner: run; exits when its drain finds nothing, or on an error
			defer wg.Done()
			o := &outs[w]
			next := q.drainer(system)
			for {
				t0 := time.Now()
				k, b, err := next(ctx)
				if err != nil {
					o.err = err
					return
				}
				if k == 0 {
					return
				}
				o.samples = append(o.samples, time.Since(t0))
				o.msgs += int64(k)
				o.bytes += int64(b)
			}
		}()
	}
	wg.Wait()
	c := queueCase{send: send}
	c.load.elapsed = time.Since(start)
	c.load.clientCPU, c.load.serverCPU = cpuSince(ctx, env, before)
	for _, o := range outs {
		if o.err != nil {
			return c, fmt.Errorf("drain: %w", o.err)
		}
		c.load.records += o.msgs
		c.load.bytes += o.bytes
		c.samples = append(c.samples, o.samples...)
	}
	if c.load.records != int64(q.n) {
		return c, fmt.Errorf("drained %d of %d messages", c.load.records, q.n)
	}
	table := "streamd.queue_messages"
	switch system {
	case "raw-skip-locked":
		table = q.raw
	case "pgmq-batched":
		table = q.pgmq
	}
	if _, err := env.Pool.Exec(context.WithoutCancel(ctx), "VACUUM "+table); err != nil {
		return c, fmt.Errorf("vacuum %s: %w", table, err)
	}
	return c, nil
}

// drainer returns one worker's drain operation for system: it takes the next batch,
// hands it over and settles it, and returns the messages and payload bytes it got (0
// when it found nothing).
func (q *queueRun) drainer(system string) func(ctx context.Context) (int, int, error) {
	switch system {
	case "streamd":
		return func(ctx context.Context) (int, int, error) {
			got, err := q.client.Receive(ctx, q.queue, &messages.ReceiveOpts{Max: queueBatch})
			if err != nil || len(got) == 0 {
				return 0, 0, err
			}
			rs, b := receiptsOf(got)
			return len(got), b, q.client.Ack(ctx, rs...)
		}
	case "streamd-ack-with-receive":
		var pending []messages.Receipt
		return func(ctx context.Context) (int, int, error) {
			got, err := q.client.Receive(ctx, q.queue, &messages.ReceiveOpts{Max: queueBatch, Ack: pending})
			if err != nil {
				return 0, 0, err
			}
			var b int
			pending, b = receiptsOf(got)
			return len(got), b, nil
		}
	case "pgmq-batched":
		return func(ctx context.Context) (int, int, error) {
			return queuebaseline.ReadDeletePgmq(ctx, q.env.Pool, q.pgmq, queueBatch)
		}
	}
	return func(ctx context.Context) (int, int, error) {
		return queuebaseline.DrainRaw(ctx, q.env.Pool, q.raw, queueBatch)
	}
}

// receiptsOf returns the receipts of msgs and their payload bytes.
func receiptsOf(msgs []*messages.Message) ([]messages.Receipt, int) {
	rs := make([]messages.Receipt, len(msgs))
	b := 0
	for i, m := range msgs {
		rs[i] = m.Receipt
		b += len(m.Data)
	}
	return rs, b
}
