package kafka

import (
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/brokers"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

func TestApiVersionsAndMetadata(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	adm := newAdmin(t, ts.addr)

	vers, err := adm.ApiVersions(ctx)
	require.NoError(t, err)
	for _, bv := range vers {
		require.NoError(t, bv.Err)
		for _, h := range handlers {
			min, max, ok := bv.KeyVersions(h.key)
			require.True(t, ok, "ApiVersions lacks %s", kmsg.NameForKey(h.key))
			require.Equal(t, h.min, min)
			require.Equal(t, h.max, max)
		}
		_, _, ok := bv.KeyVersions(kmsg.EndTxn.Int16())
		require.False(t, ok, "transactions are not supported, so EndTxn must not be listed")
	}

	topic := testdb.Name("meta")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, 3))
	md, err := adm.Metadata(ctx, topic, "no-such-topic")
	require.NoError(t, err)
	require.Len(t, md.Brokers, 1)
	self := ts.srv.self()
	require.Equal(t, self.NodeID, md.Brokers[0].NodeID)
	require.Equal(t, ts.addr, net.JoinHostPort(md.Brokers[0].Host, strconv.Itoa(int(md.Brokers[0].Port))))
	require.NotEmpty(t, md.Cluster)
	td := md.Topics[topic]
	require.NoError(t, td.Err)
	require.Len(t, td.Partitions, 3)
	for p, pd := range td.Partitions {
		require.Equal(t, p, pd.Partition)
		require.Equal(t, self.NodeID, pd.Leader)
	}
	require.ErrorIs(t, md.Topics["no-such-topic"].Err, kerr.UnknownTopicOrPartition)
}

// BrokerIdentities: an instance is that many brokers at its address (Metadata,
// DescribeCluster), the leaders of a topic's partitions spread over them, the
// coordinator is one of them, and a franz-go consumer reads every partition through
// them (a connection per identity at one address). With 1 it is one broker.
func TestBrokerIdentities(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := testCtx(t)
	topic := testdb.Name("identities")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 6))
	for p := int32(0); p < 6; p++ {
		_, err := sc.Produce(ctx, streams.Record{Stream: topic, Partition: streams.PartitionOf(p), Data: []byte(`{"p":` + strconv.Itoa(int(p)) + `}`)})
		require.NoError(t, err)
	}
	for _, n := range []int{1, 3} {
		ts := startServer(t, pool, &Config{BrokerIdentities: n})
		t.Logf("%d identities", n)
		mine := ts.srv.reg.NodeIDs()
		require.Len(t, mine, n)
		adm := newAdmin(t, ts.addr)
		md, err := adm.Metadata(ctx, topic)
		require.NoError(t, err)
		require.ElementsMatch(t, mine, md.Brokers.NodeIDs())
		leaders := map[int32]int{}
		for _, pd := range md.Topics[topic].Partitions {
			leaders[pd.Leader]++
		}
		require.Len(t, leaders, n, "6 partitions lead on every identity")
		for _, c := range leaders {
			require.Equal(t, 6/n, c, "evenly")
		}
		bs, err := adm.ListBrokers(ctx) // DescribeCluster
		require.NoError(t, err)
		require.ElementsMatch(t, mine, bs.NodeIDs())
		co := adm.FindGroupCoordinators(ctx, "g")
		require.NoError(t, co["g"].Err)
		require.Contains(t, mine, co["g"].NodeID)

		cl := newClient(t, []string{ts.addr}, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {
			0: kgo.NewOffset().AtStart(), 1: kgo.NewOffset().AtStart(), 2: kgo.NewOffset().AtStart(),
			3: kgo.NewOffset().AtStart(), 4: kgo.NewOffset().AtStart(), 5: kgo.NewOffset().AtStart()}}))
		got := map[int32]bool{}
		for len(got) < 6 {
			fs := cl.PollFetches(ctx)
			require.NoError(t, ctx.Err())
			require.Empty(t, fs.Errors())
			fs.EachRecord(func(r *kgo.Record) { got[r.Partition] = true })
		}
		ts.stop()
	}
}

// Every live instance is a broker; a stopped one leaves Metadata at once
// (deregistered), and the leaders of the partitions spread over the live ones.
func TestMetadataListsEveryLiveInstance(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	listener := testdb.Name("two")
	a := startServer(t, pool, &Config{Listener: listener})
	b := startServer(t, pool, &Config{Listener: listener})
	ctx := testCtx(t)
	topic := testdb.Name("spread")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, 8))

	adm := newAdmin(t, a.addr)
	md, err := adm.Metadata(ctx, topic)
	require.NoError(t, err)
	require.ElementsMatch(t, append(a.srv.reg.NodeIDs(), b.srv.reg.NodeIDs()...), md.Brokers.NodeIDs())
	leaders := map[int32]bool{}
	for _, pd := range md.Topics[topic].Partitions {
		leaders[pd.Leader] = true
	}
	require.Len(t, leaders, 2, "8 partitions over two brokers lead on both")

	b.stop()
	live, err := a.srv.liveBrokers(ctx)
	require.NoError(t, err)
	require.Equal(t, a.srv.reg.NodeIDs(), nodeIDs(live))
}

func nodeIDs(bs []brokers.Broker) []int32 {
	var out []int32
	for _, b := range bs {
		out = append(out, b.NodeID)
	}
	return out
}

// rawConn dials the server for hand-made frames.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	return c
}

func frame(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// requireClosed reads until the server closes the connection; a response is a
// failure.
func requireClosed(t *testing.T, c net.Conn) {
	t.Helper()
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	require.ErrorIs(t, err, io.EOF, "the server answered %d bytes instead of closing", n)
}

// Malformed frames, unknown keys and versions and oversized requests close their
// own connection only: a client on another connection is served throughout.
func TestBadFramesCostOneConnection(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{MaxRequestBytes: 4096})
	ctx := testCtx(t)
	adm := newAdmin(t, ts.addr)
	_, err := adm.ApiVersions(ctx)
	require.NoError(t, err)

	formatter := kmsg.NewRequestFormatter(kmsg.FormatterClientID("bad"))
	metaV := func(v int16) []byte {
		req := kmsg.NewPtrMetadataRequest()
		req.SetVersion(v)
		return formatter.AppendRequest(nil, req, 7)
	}
	good := metaV(9)
	cases := []struct {
		name  string
		bytes []byte
	}{
		{"shorter than a header", frame([]byte{0, 3, 0})},
		{"unknown API key", frame([]byte{0x7f, 0x00, 0, 1, 0, 0, 0, 1, 0, 0})},
		{"unsupported version", metaV(99)},
		{"body cut short", frame(good[4 : len(good)-1])},
		{"bad tagged fields", frame(append(append([]byte{}, good[4:len(good)-1]...), 0xff, 0xff, 0xff, 0xff, 0x0f))},
		{"oversized", binary.BigEndian.AppendUint32(nil, 1<<20)},
		{"negative size", binary.BigEndian.AppendUint32(nil, 0x80000000)},
	}
	for _, tc := range cases {
		c := rawConn(t, ts.addr)
		_, err := c.Write(tc.bytes)
		require.NoError(t, err, tc.name)
		requireClosed(t, c)
		_, err = adm.ApiVersions(ctx)
		require.NoError(t, err, "after %s", tc.name)
	}
	// A well-formed request on a raw connection is answered (the cases above fail
	// for their own reason, not the harness's).
	c := rawConn(t, ts.addr)
	_, err = c.Write(good)
	require.NoError(t, err)
	var size [4]byte
	_, err = io.ReadFull(c, size[:])
	require.NoError(t, err)
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err = io.ReadFull(c, body)
	require.NoError(t, err)
	require.Equal(t, uint32(7), binary.BigEndian.Uint32(body[:4]))
}

// An ApiVersions at a version the server does not know is answered (v0,
// UNSUPPORTED_VERSION, with the ranges), as Kafka does, so the client can retry
// at one it supports.
func TestApiVersionsAtUnknownVersionAnswers(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testdb.Pool(t), nil)
	req := kmsg.NewPtrApiVersionsRequest()
	req.SetVersion(4)
	b := kmsg.NewRequestFormatter().AppendRequest(nil, req, 42)
	binary.BigEndian.PutUint16(b[6:8], 77) // the version in the header
	c := rawConn(t, ts.addr)
	_, err := c.Write(b)
	require.NoError(t, err)
	var size [4]byte
	_, err = io.ReadFull(c, size[:])
	require.NoError(t, err)
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err = io.ReadFull(c, body)
	require.NoError(t, err)
	require.Equal(t, uint32(42), binary.BigEndian.Uint32(body[:4]))
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(0)
	require.NoError(t, resp.ReadFrom(body[4:]))
	require.Equal(t, kerr.UnsupportedVersion.Code, resp.ErrorCode)
	require.Len(t, resp.ApiKeys, len(handlers))
}
