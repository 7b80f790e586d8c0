package kafka

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
)

// conn is one client connection. Goroutines, all ending when the connection closes:
// serve (owned by Serve's accept loop) takes the requests in the order they arrived
// and runs each but Produce alone, after the ones before it (Kafka's per-connection
// serial processing); Produce requests run side by side in goroutines of their own
// (owned by serve, which waits for them), up to maxPipelined, each partition's
// appends in the order the requests came (turns); writeLoop (owned by serve) writes
// the answers in that order; readLoop (owned by serve) reads frames ahead by one, so
// a client that disconnects during a long request cancels it. serve waits for the
// others.
type conn struct {
	s      *Server
	nc     net.Conn
	remote string
	// ctx ends when the connection is closed or the client went away: the requests'
	// I/O runs under it.
	ctx    context.Context
	cancel context.CancelFunc
	// draining ends when the server starts shutting down: long polls answer at once.
	draining context.Context
	frames   chan []byte
	stopping atomic.Bool
	closeOne sync.Once

	// principal is who the client is: AdminPrincipal on a server without Tokens, else
	// "" until SASL authenticated it (only ApiVersions and the SASL APIs are served
	// before). authenticated says principal is set, for readLoop's frame bound.
	principal     string
	authenticated atomic.Bool
	// sasl is the SASL exchange under way (SaslHandshake to SaslAuthenticate).
	sasl *saslExchange
	// closeAfterResponse: a handler's answer is the last one (a failed SASL exchange).
	closeAfterResponse bool
	// lastAppend is, by partition, the turn of the last Produce append serve
	// dispatched on this connection (takeTurns).
	lastAppend map[topicPartition]chan struct{}
	// stash holds the partition reads a Fetch left running when it answered, for the
	// next Fetch (01_fetch.go); fetchSem bounds the connection's reads at once
	// (fetchParallelism), those included.
	stash    fetchStash
	fetchSem chan struct{}
}

func (s *Server) newConn(nc net.Conn, draining context.Context) *conn {
	ctx, cancel := context.WithCancel(context.WithoutCancel(draining))
	c := &conn{s: s, nc: nc, remote: nc.RemoteAddr().String(), ctx: ctx, cancel: cancel,
		draining: draining, frames: make(chan []byte), fetchSem: make(chan struct{}, fetchParallelism)}
	if s.auth == nil {
		c.principal = access.AdminPrincipal
		c.authenticated.Store(true)
	}
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	return c
}

// stopReading makes the connection take no new request: the one in flight finishes
// and is answered, then the connection closes.
func (c *conn) stopReading() {
	c.stopping.Store(true)
	_ = c.nc.SetReadDeadline(time.Now())
}

// close ends the connection at once, cancelling the request in flight.
func (c *conn) close() {
	c.closeOne.Do(func() {
		c.cancel()
		_ = c.nc.Close()
	})
}

// maxPipelined bounds the Produce requests of one connection handled at once.
// franz-go's idempotent producer keeps up to 5 in flight per broker.
const maxPipelined = 5

// reply is one answer to write, in the order the requests came: a response (nil:
// none, as for Produce with acks=0), a raw SASL reply, or an error that closes the
// connection. ready, when not nil, is closed once the reply is complete.
type reply struct {
	ready chan struct{}
	resp  kmsg.Response
	corr  int32
	raw   []byte
	isRaw bool
	err   error
	// last: the connection closes after this answer (a failed SASL exchange).
	last bool
}

func (c *conn) serve() {
	c.s.metrics.connections.Inc()
	readDone := make(chan struct{})
	writeDone := make(chan struct{})
	replies := make(chan *reply, maxPipelined)
	var producing sync.WaitGroup // the Produce requests under way
	defer func() {
		close(replies)
		<-writeDone
		producing.Wait()
		c.close()
		<-readDone
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
		c.s.metrics.connections.Dec()
	}()
	go func() {
		defer close(readDone)
		c.readLoop()
	}()
	go func() {
		defer close(writeDone)
		c.writeLoop(replies)
	}()
	send := func(r *reply) bool {
		select {
		case replies <- r:
			return true
		case <-c.ctx.Done():
			return false
		}
	}
	for body := range c.frames {
		if c.sasl != nil && c.sasl.raw {
			raw, err := c.rawSASL(body)
			if err != nil {
				return
			}
			if !send(&reply{raw: raw, isRaw: true}) {
				return
			}
			continue
		}
		call, r := c.prepare(body)
		if call != nil && call.h.key == produceHandler.key {
			// Produce requests run side by side, so that an append's commit does not
			// hold up the next request's appends to other partitions (a producer
			// keeps several in flight); per partition they still append in the order
			// they came (turns), and their answers go out in that order.
			call.turns = c.takeTurns(call.kreq.(*kmsg.ProduceRequest))
			r := &reply{ready: make(chan struct{}), corr: call.h.corr}
			producing.Add(1)
			go func() { // owner: serve, which waits for it (producing) before returning
				defer producing.Done()
				defer close(r.ready)
				r.resp, r.err = c.run(call)
			}()
			if !send(r) {
				return
			}
			continue
		}
		// Every other request runs alone, after the Produce requests before it, as
		// Kafka serves a connection's requests one at a time.
		producing.Wait()
		if call != nil {
			r.resp, r.err = c.run(call)
			r.corr = call.h.corr
		}
		r.last = c.closeAfterResponse
		if !send(r) || r.err != nil || r.last {
			return
		}
	}
}

// writeLoop writes the replies in order, each once it is ready. A reply with an
// error, a failed write or a last reply closes the connection.
func (c *conn) writeLoop(replies <-chan *reply) {
	var out []byte
	for r := range replies {
		if r.ready != nil {
			<-r.ready
		}
		switch {
		case r.err != nil:
			c.s.logger.Debug("kafka connection closed", "remote", c.remote, "err", r.err)
			c.close()
			return
		case r.isRaw:
			out = append(binary.BigEndian.AppendUint32(out[:0], uint32(len(r.raw))), r.raw...)
		case r.resp == nil:
			continue
		default:
			out = encodeResponse(out[:0], r.corr, r.resp)
		}
		if _, err := c.nc.Write(out); err != nil {
			c.s.logger.Debug("kafka write failed", "remote", c.remote, "err", err)
			c.close()
			return
		}
		if r.last {
			c.close()
			return
		}
	}
}

// turn orders one partition's appends across the pipelined Produce requests of a
// connection: an append waits for prev (the same partition's append of the request
// before, nil: none) and closes cur when it is done.
type turn struct{ prev, cur chan struct{} }

// wait blocks until the append before is done, or ctx ends.
func (t turn) wait(ctx context.Context) error {
	if t.prev == nil {
		return nil
	}
	select {
	case <-t.prev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// done lets the next append of the partition go.
func (t turn) done() {
	if t.cur != nil {
		close(t.cur)
	}
}

// pass is done for a partition that appends nothing: the next append of the
// partition still waits for the one before.
func (t turn) pass(ctx context.Context) {
	if t.prev == nil {
		t.done()
		return
	}
	go func() { // owner: the request; ends when the append before is done or ctx ends
		_ = t.wait(ctx)
		t.done()
	}()
}

// takeTurns gives each partition of req (in request order: topics, then their
// partitions) its turn after the same partition's append in the Produce requests
// before. Called by serve only, in the order the requests came.
func (c *conn) takeTurns(req *kmsg.ProduceRequest) []turn {
	if c.lastAppend == nil {
		c.lastAppend = map[topicPartition]chan struct{}{}
	}
	if len(c.lastAppend) > 4096 {
		for tp, ch := range c.lastAppend {
			select {
			case <-ch:
				delete(c.lastAppend, tp)
			default:
			}
		}
	}
	var turns []turn
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			tp := topicPartition{t.Topic, p.Partition}
			cur := make(chan struct{})
			turns = append(turns, turn{prev: c.lastAppend[tp], cur: cur})
			c.lastAppend[tp] = cur
		}
	}
	return turns
}

type topicPartition struct {
	topic     string
	partition int32
}

// readLoop reads size-prefixed frames and hands them to serve one at a time. A frame
// over MaxRequestBytes (or of a negative size) closes the connection unread.
func (c *conn) readLoop() {
	defer close(c.frames)
	var size [4]byte
	for {
		if _, err := io.ReadFull(c.nc, size[:]); err != nil {
			c.readEnded(err)
			return
		}
		n := int32(binary.BigEndian.Uint32(size[:]))
		limit := c.s.cfg.MaxRequestBytes
		if !c.authenticated.Load() {
			limit = min(limit, preAuthMaxBytes)
		}
		if n < 0 || n > limit {
			c.s.logger.Warn("kafka request too large: closing the connection", "remote", c.remote,
				"size", n, "max_request_bytes", limit)
			c.s.metrics.malformed.Inc()
			c.close()
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(c.nc, body); err != nil {
			c.readEnded(err)
			return
		}
		select {
		case c.frames <- body:
		case <-c.ctx.Done():
			return
		}
	}
}

// readEnded: a read failed. Unless the server asked the connection to stop reading
// (then the request in flight still gets its answer), the client is gone: cancel
// what it asked for.
func (c *conn) readEnded(err error) {
	if c.stopping.Load() {
		return
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		c.s.logger.Debug("kafka read failed", "remote", c.remote, "err", err)
	}
	c.cancel()
}

// header is a request header.
type header struct {
	key      int16
	version  int16
	corr     int32
	clientID string
}

// errMalformed: a frame that kmsg cannot decode. It closes the connection.
var errMalformed = errors.New("malformed request")

// decodeRequest parses a request frame (without its size): the header, then the
// body with kmsg. An unknown key or a version outside the handler's range returns
// h with a nil request and no error, for the caller to decide; bytes that do not
// decode return errMalformed.
func decodeRequest(table map[int16]*handler, body []byte) (header, *handler, kmsg.Request, error) {
	var h header
	r := kbin.Reader{Src: body}
	h.key = r.Int16()
	h.version = r.Int16()
	h.corr = r.Int32()
	cid := r.NullableString()
	if !r.Ok() {
		return h, nil, nil, fmt.Errorf("%w: a frame of %d bytes is shorter than a request header", errMalformed, len(body))
	}
	if cid != nil {
		h.clientID = *cid
	}
	hd := table[h.key]
	if hd == nil || h.version < hd.min || h.version > hd.max {
		return h, hd, nil, nil
	}
	kreq := kmsg.RequestForKey(h.key)
	kreq.SetVersion(h.version)
	if kreq.IsFlexible() {
		kmsg.SkipTags(&r)
		if !r.Ok() {
			return h, hd, nil, fmt.Errorf("%w: %s v%d: bad header tags", errMalformed, kmsg.NameForKey(h.key), h.version)
		}
	}
	if err := kreq.ReadFrom(r.Src); err != nil {
		return h, hd, nil, fmt.Errorf("%w: %s v%d: %v", errMalformed, kmsg.NameForKey(h.key), h.version, err)
	}
	return h, hd, kreq, nil
}

// call is a decoded request, ready to run.
type call struct {
	h     header
	hd    *handler
	kreq  kmsg.Request
	turns []turn // Produce: the partitions' turns (takeTurns)
}

// prepare decodes one frame. It returns the request to run, or (call nil) the reply
// to send at once: ApiVersions' UNSUPPORTED_VERSION answer, or an error that closes
// the connection (a malformed frame, an unknown key or an unsupported version, a
// request before SASL authentication).
func (c *conn) prepare(body []byte) (cl *call, r *reply) {
	defer func() {
		// A bug in decoding costs this connection, never the server.
		if p := recover(); p != nil {
			c.s.logger.Error("kafka request decoding panicked: closing the connection", "remote", c.remote,
				"panic", p, "stack", string(debug.Stack()))
			cl, r = nil, &reply{err: fmt.Errorf("decoding panicked: %v", p)}
		}
	}()
	h, hd, kreq, err := decodeRequest(c.s.table, body)
	if err != nil {
		c.s.metrics.malformed.Inc()
		c.s.logger.Warn("kafka malformed request: closing the connection", "remote", c.remote, "err", err)
		return nil, &reply{err: err}
	}
	if kreq == nil {
		if h.key == apiVersionsHandler.key {
			// Kafka answers an ApiVersions it cannot parse with a v0 response that
			// carries UNSUPPORTED_VERSION and the supported ranges.
			return nil, &reply{resp: c.s.apiVersionsResponse(0, unsupportedVersion), corr: h.corr}
		}
		c.s.metrics.malformed.Inc()
		if hd == nil {
			c.s.logger.Warn("kafka unknown API key: closing the connection", "remote", c.remote, "api_key", h.key)
			return nil, &reply{err: fmt.Errorf("unknown API key %d", h.key)}
		}
		c.s.logger.Warn("kafka unsupported API version: closing the connection", "remote", c.remote,
			"api", kmsg.NameForKey(h.key), "version", h.version, "min", hd.min, "max", hd.max)
		return nil, &reply{err: fmt.Errorf("%s v%d unsupported", kmsg.NameForKey(h.key), h.version)}
	}
	if !c.authenticated.Load() && !servedBeforeAuthentication(h.key) {
		// Kafka closes a connection that sends anything else before authenticating.
		c.s.metrics.malformed.Inc()
		c.s.logger.Warn("kafka request before SASL authentication: closing the connection", "remote", c.remote, "api", kmsg.NameForKey(h.key))
		return nil, &reply{err: fmt.Errorf("%s before SASL authentication", kmsg.NameForKey(h.key))}
	}
	return &call{h: h, hd: hd, kreq: kreq}, &reply{}
}

// run answers one request. It returns the response to send (nil: none); an error
// closes the connection: a handler's error or panic.
func (c *conn) run(cl *call) (resp kmsg.Response, err error) {
	api := kmsg.NameForKey(cl.h.key)
	defer func() {
		// A bug in a handler costs this connection, never the server.
		if p := recover(); p != nil {
			c.s.logger.Error("kafka request panicked: closing the connection", "remote", c.remote,
				"api", api, "panic", p, "stack", string(debug.Stack()))
			resp, err = nil, fmt.Errorf("%s panicked: %v", api, p)
		}
	}()
	h := cl.h
	start := time.Now()
	resp, err = cl.hd.fn(c.ctx, &request{s: c.s, c: c, key: h.key, version: h.version, corr: h.corr, clientID: h.clientID,
		kreq: cl.kreq, turns: cl.turns})
	c.s.metrics.observe(h.key, time.Since(start), err)
	if err != nil {
		c.s.logger.Warn("kafka request failed: closing the connection", "remote", c.remote,
			"api", api, "version", h.version, "err", err)
		return nil, err
	}
	return resp, nil
}

// encodeResponse appends a response frame: size, correlation id, the header's empty
// tag section (flexible responses except ApiVersions, whose header is always v0),
// the body.
func encodeResponse(dst []byte, corr int32, resp kmsg.Response) []byte {
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[4:8], uint32(corr))
	if resp.IsFlexible() && resp.Key() != apiVersionsHandler.key {
		dst = append(dst, 0)
	}
	dst = resp.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[:4], uint32(len(dst)-4))
	return dst
}
