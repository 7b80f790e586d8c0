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

// conn is one client connection. Goroutines: serve (owned by Serve's accept loop)
// runs the requests one at a time, in the order they arrived, so responses go out
// in order (Kafka's per-connection serial processing); readLoop (owned by serve)
// reads frames ahead by one, so a client that disconnects during a long request
// cancels it. Both end when the connection closes; serve waits for readLoop.
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
}

func (s *Server) newConn(nc net.Conn, draining context.Context) *conn {
	ctx, cancel := context.WithCancel(context.WithoutCancel(draining))
	c := &conn{s: s, nc: nc, remote: nc.RemoteAddr().String(), ctx: ctx, cancel: cancel,
		draining: draining, frames: make(chan []byte)}
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

func (c *conn) serve() {
	c.s.metrics.connections.Inc()
	readDone := make(chan struct{})
	defer func() {
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
	var out []byte
	for body := range c.frames {
		if c.sasl != nil && c.sasl.raw {
			reply, err := c.rawSASL(body)
			if err != nil {
				return
			}
			out = append(binary.BigEndian.AppendUint32(out[:0], uint32(len(reply))), reply...)
			if _, err := c.nc.Write(out); err != nil {
				return
			}
			continue
		}
		resp, corr, err := c.handle(body)
		if err != nil {
			c.s.logger.Debug("kafka connection closed", "remote", c.remote, "err", err)
			return
		}
		if resp == nil {
			continue
		}
		out = encodeResponse(out[:0], corr, resp)
		if _, err := c.nc.Write(out); err != nil {
			c.s.logger.Debug("kafka write failed", "remote", c.remote, "err", err)
			return
		}
		if c.closeAfterResponse {
			return
		}
	}
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

// handle decodes and answers one frame. It returns the response to send (nil: none)
// and its correlation id; an error closes the connection: a malformed frame, an
// unknown key or an unsupported version (except ApiVersions, which answers
// UNSUPPORTED_VERSION so that the client can pick another), a handler's error or
// panic.
func (c *conn) handle(body []byte) (resp kmsg.Response, corr int32, err error) {
	api := "request"
	defer func() {
		// A bug in decoding or in a handler costs this connection, never the server.
		if p := recover(); p != nil {
			c.s.logger.Error("kafka request panicked: closing the connection", "remote", c.remote,
				"api", api, "panic", p, "stack", string(debug.Stack()))
			resp, err = nil, fmt.Errorf("%s panicked: %v", api, p)
		}
	}()
	h, hd, kreq, err := decodeRequest(c.s.table, body)
	if err != nil {
		c.s.metrics.malformed.Inc()
		c.s.logger.Warn("kafka malformed request: closing the connection", "remote", c.remote, "err", err)
		return nil, 0, err
	}
	if kreq == nil {
		if h.key == apiVersionsHandler.key {
			// Kafka answers an ApiVersions it cannot parse with a v0 response that
			// carries UNSUPPORTED_VERSION and the supported ranges.
			return c.s.apiVersionsResponse(0, unsupportedVersion), h.corr, nil
		}
		c.s.metrics.malformed.Inc()
		if hd == nil {
			c.s.logger.Warn("kafka unknown API key: closing the connection", "remote", c.remote, "api_key", h.key)
			return nil, 0, fmt.Errorf("unknown API key %d", h.key)
		}
		c.s.logger.Warn("kafka unsupported API version: closing the connection", "remote", c.remote,
			"api", kmsg.NameForKey(h.key), "version", h.version, "min", hd.min, "max", hd.max)
		return nil, 0, fmt.Errorf("%s v%d unsupported", kmsg.NameForKey(h.key), h.version)
	}
	api = kmsg.NameForKey(h.key)
	if !c.authenticated.Load() && !servedBeforeAuthentication(h.key) {
		// Kafka closes a connection that sends anything else before authenticating.
		c.s.metrics.malformed.Inc()
		c.s.logger.Warn("kafka request before SASL authentication: closing the connection", "remote", c.remote, "api", api)
		return nil, 0, fmt.Errorf("%s before SASL authentication", api)
	}
	start := time.Now()
	resp, err = hd.fn(c.ctx, &request{s: c.s, c: c, key: h.key, version: h.version, corr: h.corr, clientID: h.clientID, kreq: kreq})
	c.s.metrics.observe(h.key, time.Since(start), err)
	if err != nil {
		c.s.logger.Warn("kafka request failed: closing the connection", "remote", c.remote,
			"api", kmsg.NameForKey(h.key), "version", h.version, "err", err)
		return nil, 0, err
	}
	return resp, h.corr, nil
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
