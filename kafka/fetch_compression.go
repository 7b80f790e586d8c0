package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

// Compressed fetches (docs/kafka.md, "Compression"). streamd stores records, not the
// producer's batches, so a Fetch builds its batches from the records; a topic whose
// compression.type is gzip, snappy, lz4 or zstd (performance_config.enableCompression
// and compressionCodec) gets them compressed with it, by franz-go's compressors (the
// codecs' libraries the produce path decompresses with). A topic that sets nothing
// follows Config.Compression, uncompressed by default.

// The compression.type names, Kafka's.
const (
	compressionUncompressed = "uncompressed"
	compressionProducer     = "producer"
	compressionGzip         = "gzip"
	compressionSnappy       = "snappy"
	compressionLZ4          = "lz4"
	compressionZstd         = "zstd"
)

// compressionCodecs maps the compression.type names streamd serves to their codecs.
var compressionCodecs = map[string]int8{
	compressionUncompressed: codecNone,
	compressionGzip:         codecGzip,
	compressionSnappy:       codecSnappy,
	compressionLZ4:          codecLZ4,
	compressionZstd:         codecZstd,
}

// compressionOf is the compression.type a stream's performance_config asks for, or
// def when it says nothing (enableCompression absent).
func compressionOf(p *streamconfig.Performance, def string) string {
	switch {
	case p == nil || p.EnableCompression == nil:
		return def
	case !*p.EnableCompression:
		return compressionUncompressed
	case p.CompressionCodec != "":
		return p.CompressionCodec
	}
	return streamconfig.DefaultCompressionCodec
}

// compressionTTL is how long an instance keeps a topic's compression.type: a change
// made through another instance (or SQL) reaches this one's fetches within it (and
// the refresh's read); one made through this instance applies to the next fetch.
const compressionTTL = time.Second

// compressedReadFactor: a compressed partition reads up to this many times its byte
// limit in records (the limit counts the bytes sent, as Kafka's does), then cuts the
// batches at the limit.
const compressedReadFactor = 4

type cachedCompression struct {
	codec int8
	// compacted: the topic's cleanup.policy compacts (Produce refuses keyless
	// records, as Kafka does).
	compacted  bool
	expires    time.Time
	refreshing bool // a refresh goroutine reads it again
}

// topicCompression caches each topic's fetch codec and whether it is compacted
// (Server.compression).
type topicCompression struct {
	mu      sync.Mutex
	byTopic map[string]cachedCompression
	// forgets counts forgetCompression's calls: a refresh that began before one
	// does not store what it read (it may predate the change).
	forgets uint64
	// refreshes are the goroutines re-reading expired entries; Serve waits for them.
	refreshes sync.WaitGroup
}

// compressionRefreshTimeout bounds a background refresh of a topic's codec.
const compressionRefreshTimeout = 10 * time.Second

// fetchCodec is topic's fetch codec, from the cache or the stream's configuration.
// A topic's first fetch reads the configuration; once its entry expires, fetches go
// on with the cached codec while one goroutine (owned by the Server, waited for by
// Serve) reads it again, so that the read is never on a fetch's path (it was a round
// trip every second inside a long poll's pass, at the tail of the end-to-end
// latency). A configuration that cannot be read serves uncompressed for a new entry
// and the cached codec for a refreshed one (the fetch itself reports a missing
// stream).
func (s *Server) fetchCodec(ctx context.Context, topic string) int8 {
	return s.cachedTopic(ctx, topic).codec
}

// topicCompacted says whether topic's cleanup.policy compacts, as fetchCodec reads
// the codec (a change made through another instance applies within
// compressionTTL).
func (s *Server) topicCompacted(ctx context.Context, topic string) bool {
	return s.cachedTopic(ctx, topic).compacted
}

// cachedTopic is topic's entry, from the cache or the stream's configuration
// (fetchCodec).
func (s *Server) cachedTopic(ctx context.Context, topic string) cachedCompression {
	now := time.Now()
	s.compression.mu.Lock()
	c, ok := s.compression.byTopic[topic]
	if ok && now.After(c.expires) && !c.refreshing {
		c.refreshing = true
		s.compression.byTopic[topic] = c
		s.compression.refreshes.Add(1)
		forgets := s.compression.forgets
		go func() { // owner: the Server (Serve waits for refreshes); exits after one read
			defer s.compression.refreshes.Done()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), compressionRefreshTimeout)
			defer cancel()
			s.loadCodec(rctx, topic, c, forgets)
		}()
	}
	forgets := s.compression.forgets
	s.compression.mu.Unlock()
	if ok {
		return c
	}
	return s.loadCodec(ctx, topic, cachedCompression{codec: codecNone}, forgets)
}

// loadCodec reads topic's codec and cleanup policy from its configuration and
// caches them, unless forgetCompression ran since forgets was read. When the
// configuration cannot be read it caches fallback (what the refreshed entry held;
// uncompressed for a new one).
func (s *Server) loadCodec(ctx context.Context, topic string, fallback cachedCompression, forgets uint64) cachedCompression {
	now := time.Now()
	e := cachedCompression{codec: compressionCodecs[s.cfg.Compression]}
	cfg, err := streamconfig.GetTx(ctx, s.pool, topic)
	switch {
	case err == nil:
		e.codec = compressionCodecs[compressionOf(cfg.Performance, s.cfg.Compression)]
		if r := cfg.Retention; r != nil {
			e.compacted = r.CleanupPolicy == streamconfig.CleanupCompact || r.CleanupPolicy == streamconfig.CleanupCompactDelete
		}
	case errors.Is(err, streams.ErrStreamNotFound):
	default:
		s.logger.Warn("kafka fetch: cannot read the topic's compression", "stream", topic, "error", err)
		e = cachedCompression{codec: fallback.codec, compacted: fallback.compacted}
	}
	s.compression.mu.Lock()
	defer s.compression.mu.Unlock()
	if s.compression.forgets != forgets {
		delete(s.compression.byTopic, topic) // read again by the next fetch
		return e
	}
	if s.compression.byTopic == nil || len(s.compression.byTopic) > 10000 {
		s.compression.byTopic = map[string]cachedCompression{}
	}
	e.expires = now.Add(compressionTTL)
	s.compression.byTopic[topic] = e
	return e
}

// forgetCompression drops topic from the cache after this instance changed its
// configuration (or deleted it), so its next fetch reads it again.
func (s *Server) forgetCompression(topic string) {
	s.compression.mu.Lock()
	delete(s.compression.byTopic, topic)
	s.compression.forgets++
	s.compression.mu.Unlock()
}

// compressors are franz-go's, one per codec (safe for concurrent use: they pool
// their writers).
var compressors = func() map[int8]kgo.Compressor {
	out := map[int8]kgo.Compressor{}
	for codec, c := range map[int8]kgo.CompressionCodec{
		codecGzip: kgo.GzipCompression(), codecSnappy: kgo.SnappyCompression(),
		codecLZ4: kgo.Lz4Compression(), codecZstd: kgo.ZstdCompression(),
	} {
		comp, err := kgo.DefaultCompressor(c)
		if err != nil || comp == nil {
			panic(fmt.Sprintf("kafka: franz-go compressor for codec %d: %v", codec, err))
		}
		out[codec] = comp
	}
	return out
}()

// compressRecords compresses a batch's encoded records with codec into scratch and
// returns them, or nil when the codec failed (the batch then goes uncompressed).
func compressRecords(codec int8, records []byte, scratch *bytes.Buffer) []byte {
	scratch.Reset()
	out, used := compressors[codec].Compress(scratch, records)
	if int8(used) != codec {
		return nil
	}
	return out
}

// compressedReadBytes is how many record bytes a compressed partition reads for a
// limit of maxBytes sent: compressedReadFactor times, at most 32 MiB more.
func compressedReadBytes(maxBytes int) int {
	return min(maxBytes*compressedReadFactor, maxBytes+32<<20)
}

// appendCompressedBatches is appendBatches with each batch's records compressed with
// codec: the same batches (one per run of events with the same log time), until the
// bytes appended pass limit (the first batch goes whatever its size, as in Kafka;
// the events after the cut are fetched next time).
func appendCompressedBatches(dst []byte, events []streams.Event, codec int8, limit int) []byte {
	var (
		plain   []byte
		scratch bytes.Buffer
	)
	sc := getBatchScratch()
	defer sc.release()
	base := len(dst)
	for start := 0; start < len(events); {
		end := runEnd(events, start)
		plain = sc.appendRecords(plain[:0], events[start:end])
		recs, used := plain, int8(codecNone)
		if out := compressRecords(codec, plain, &scratch); out != nil {
			recs, used = out, codec
		}
		at := len(dst)
		dst = sc.appendBatchOf(dst, events[start:end], used, recs)
		if len(dst)-base > limit && at > base {
			return dst[:at]
		}
		start = end
	}
	return dst
}
