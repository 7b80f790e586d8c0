package kafka

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// dropProxy forwards Kafka connections to target and, for every dropEvery-th
// Produce response, closes both sides instead of forwarding it: the request was
// handled, its answer is lost, and the client retries it on a new connection.
type dropProxy struct {
	ln        net.Listener
	target    atomic.Pointer[string]
	dropEvery int64
	responses atomic.Int64
	dropped   atomic.Int64
	wg        sync.WaitGroup
}

// startDropProxy listens; setTarget says where to forward before the first dial.
func startDropProxy(t *testing.T, dropEvery int64) *dropProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &dropProxy{ln: ln, dropEvery: dropEvery}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *dropProxy) serve(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", *p.target.Load())
	if err != nil {
		return
	}
	defer s.Close()
	var keys sync.Map // correlation id -> API key of the requests in flight
	go func() {
		defer s.Close()
		var size [4]byte
		for {
			if _, err := io.ReadFull(c, size[:]); err != nil {
				return
			}
			body := make([]byte, binary.BigEndian.Uint32(size[:]))
			if _, err := io.ReadFull(c, body); err != nil || len(body) < 8 {
				return
			}
			keys.Store(binary.BigEndian.Uint32(body[4:8]), binary.BigEndian.Uint16(body[0:2]))
			if _, err := s.Write(append(size[:], body...)); err != nil {
				return
			}
		}
	}()
	var size [4]byte
	for {
		if _, err := io.ReadFull(s, size[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(s, body); err != nil {
			return
		}
		key, _ := keys.LoadAndDelete(binary.BigEndian.Uint32(body[0:4]))
		if key == uint16(0) && p.responses.Add(1)%p.dropEvery == 0 {
			p.dropped.Add(1)
			return // both connections close: the answer is lost
		}
		if _, err := c.Write(append(size[:], body...)); err != nil {
			return
		}
	}
}

// An idempotent producer (franz-go's defaults) whose answers are lost retries its
// batches on new connections; the log stores every record once, in order.
func TestIdempotentProducerRetriesStoreNothingTwice(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	// The server advertises the proxy, so every connection goes through it.
	proxy := startDropProxy(t, 3)
	ts := startServer(t, pool, &Config{AdvertisedAddr: proxy.ln.Addr().String()})
	proxy.target.Store(&ts.addr)

	ctx := testCtx(t)
	topic := testdb.Name("idem")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 3))
	prod := newClient(t, []string{proxy.ln.Addr().String()}, kgo.DefaultProduceTopic(topic),
		kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }), kgo.RequestRetries(100),
		kgo.ProducerLinger(time.Millisecond))
	const n, waves = 1500, 30
	var failed atomic.Int64
	for w := range waves {
		var wg sync.WaitGroup
		for i := w * n / waves; i < (w+1)*n/waves; i++ {
			wg.Add(1)
			prod.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i%17)), Value: []byte(fmt.Sprintf("v%d", i))},
				func(_ *kgo.Record, err error) {
					defer wg.Done()
					if err != nil {
						failed.Add(1)
						t.Logf("produce: %v", err)
					}
				})
		}
		wg.Wait()
	}
	require.Zero(t, failed.Load())
	require.Positive(t, proxy.dropped.Load(), "the proxy must actually lose answers")

	seen := map[string]int{}
	total := 0
	for p := int32(0); p < 3; p++ {
		for off := int64(0); ; {
			res, err := sc.Fetch(ctx, topic, p, off, &streams.FetchOpts{MaxRecords: 1000})
			require.NoError(t, err)
			if len(res.Events) == 0 {
				break
			}
			for _, e := range res.Events {
				seen[string(e.Bytes)]++
				total++
			}
			off = res.NextOffset
		}
	}
	require.Equal(t, n, total, "every record stored once (%d answers lost)", proxy.dropped.Load())
	for v, c := range seen {
		require.Equal(t, 1, c, "record %s stored %d times", v, c)
	}
}
