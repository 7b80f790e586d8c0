package kafka

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// assignments tracks what each group client owns, from its rebalance callbacks.
type assignments struct {
	mu    sync.Mutex
	owned map[string]map[int32]bool // client name -> partitions
}

func newAssignments() *assignments { return &assignments{owned: map[string]map[int32]bool{}} }

func (a *assignments) opts(name string) []kgo.Opt {
	a.mu.Lock()
	a.owned[name] = map[int32]bool{}
	a.mu.Unlock()
	return []kgo.Opt{
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, ps := range m {
				for _, p := range ps {
					a.owned[name][p] = true
				}
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, ps := range m {
				for _, p := range ps {
					delete(a.owned[name], p)
				}
			}
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, ps := range m {
				for _, p := range ps {
					delete(a.owned[name], p)
				}
			}
		}),
	}
}

func (a *assignments) of(name string) []int32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []int32
	for p := range a.owned[name] {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

func (a *assignments) drop(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.owned, name)
}

// balanced reports whether the members together own each of n partitions exactly once,
// every member owning n/m or n/m+1 of them.
func (a *assignments) balanced(n int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := map[int32]int{}
	for _, ps := range a.owned {
		if len(ps) < n/len(a.owned) || len(ps) > n/len(a.owned)+1 {
			return false
		}
		for p := range ps {
			seen[p]++
		}
	}
	if len(seen) != n {
		return false
	}
	for _, c := range seen {
		if c != 1 {
			return false
		}
	}
	return true
}

func groupClientOpts(group, topic string, balancer kgo.GroupBalancer) []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.Balancers(balancer),
		kgo.SessionTimeout(3 * time.Second), kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second), kgo.DisableAutoCommit(),
	}
}

// TestGroupRebalancesWithKgo: franz-go group clients (range and cooperative-sticky,
// the assignment computed by the client leader) share a topic's partitions exactly
// once and balanced; a member that joins later and one that leaves rebalance the
// group; kadm sees the group and its members; commits from the current generation
// land and are read back, and the admin cannot delete a group with members.
func TestGroupRebalancesWithKgo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		balancer kgo.GroupBalancer
		protocol string
	}{
		{"range", kgo.RangeBalancer(), "range"},
		{"cooperative-sticky", kgo.CooperativeStickyBalancer(), "cooperative-sticky"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := testdb.Pool(t)
			ts := startServer(t, pool, nil)
			ctx := testCtx(t)
			topic, group := testdb.Name("kg"), testdb.Name("kg")
			require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, 6))
			for p := int32(0); p < 6; p++ {
				recs := make([]streams.Record, 5)
				for i := range recs {
					recs[i] = streams.Record{Stream: topic, Partition: &p, Bytes: []byte("v")}
				}
				_, err := streams.NewClient(pool, nil).Produce(ctx, recs...)
				require.NoError(t, err)
			}
			as := newAssignments()
			c1 := newClient(t, []string{ts.addr}, append(groupClientOpts(group, topic, tc.balancer), as.opts("c1")...)...)
			c2 := newClient(t, []string{ts.addr}, append(groupClientOpts(group, topic, tc.balancer), as.opts("c2")...)...)
			require.Eventually(t, func() bool { return as.balanced(6) }, 30*time.Second, 10*time.Millisecond, "two members")

			c3 := newClient(t, []string{ts.addr}, append(groupClientOpts(group, topic, tc.balancer), as.opts("c3")...)...)
			require.Eventually(t, func() bool { return as.balanced(6) }, 30*time.Second, 10*time.Millisecond, "three members")

			adm := newAdmin(t, ts.addr)
			require.Eventually(t, func() bool {
				dg, err := adm.DescribeGroups(ctx, group)
				require.NoError(t, err)
				d := dg[group]
				return d.State == "Stable" && len(d.Members) == 3 && d.Protocol == tc.protocol && d.ProtocolType == "consumer"
			}, 30*time.Second, 10*time.Millisecond)
			listed, err := adm.ListGroups(ctx)
			require.NoError(t, err)
			require.Contains(t, listed.Groups(), group)
			deleted, err := adm.DeleteGroups(ctx, group)
			require.NoError(t, err)
			require.ErrorIs(t, deleted[group].Err, kerr.NonEmptyGroup)

			// A member commits within its generation; the offsets read back, and are the
			// rows streamd's own admin reports.
			var committed kadm.Offsets
			require.Eventually(t, func() bool {
				owned := map[string][]int32{topic: as.of("c1")}
				if len(owned[topic]) == 0 {
					return false
				}
				offs := map[string]map[int32]kgo.EpochOffset{topic: {}}
				for _, p := range owned[topic] {
					offs[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: 3}
				}
				var cerr error
				c1.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
					cerr = err
					if err == nil {
						for _, rt := range resp.Topics {
							for _, rp := range rt.Partitions {
								if e := kerr.ErrorForCode(rp.ErrorCode); e != nil {
									cerr = e
								}
							}
						}
					}
				})
				if cerr != nil {
					return false // a rebalance was under way; try again
				}
				committed = kadm.Offsets{}
				for _, p := range owned[topic] {
					committed.Add(kadm.Offset{Topic: topic, Partition: p, At: 3, LeaderEpoch: -1})
				}
				return true
			}, 30*time.Second, 50*time.Millisecond)
			fetched, err := adm.FetchOffsets(ctx, group)
			require.NoError(t, err)
			committed.Each(func(o kadm.Offset) {
				got, ok := fetched.Lookup(topic, o.Partition)
				require.True(t, ok, "partition %d", o.Partition)
				require.Equal(t, int64(3), got.At)
			})
			d, err := consumergroup.NewAdmin(pool).DescribeGroup(ctx, topic, group)
			require.NoError(t, err)
			c1ID, _ := c1.GroupMetadata()
			lagged := 0
			for _, ps := range d.PartitionStatus {
				if slices.Contains(as.of("c1"), ps.Partition) {
					require.Equal(t, c1ID, ps.Owner, "consumer_group_status names the classic owner of %d", ps.Partition)
				}
				if ps.CommittedOffset != nil {
					require.Equal(t, int64(2), ps.Lag)
					lagged++
				}
			}
			require.Equal(t, len(committed[topic]), lagged)

			// c2 leaves: the other two take over its partitions.
			c2.Close()
			as.drop("c2")
			require.Eventually(t, func() bool { return as.balanced(6) }, 30*time.Second, 10*time.Millisecond, "after c2 left")
			c1.Close()
			c3.Close()
			as.drop("c1")
			as.drop("c3")
			require.Eventually(t, func() bool {
				dg, err := adm.DescribeGroups(ctx, group)
				require.NoError(t, err)
				return dg[group].State == "Empty"
			}, 30*time.Second, 10*time.Millisecond)

			// Offsets of an empty group can be deleted, then the group.
			var toDelete kadm.TopicsSet = map[string]map[int32]struct{}{topic: {0: {}}}
			odr, err := adm.DeleteOffsets(ctx, group, toDelete)
			require.NoError(t, err)
			require.NoError(t, odr.Error())
			deleted, err = adm.DeleteGroups(ctx, group)
			require.NoError(t, err)
			require.NoError(t, deleted[group].Err)
			listed, err = adm.ListGroups(ctx)
			require.NoError(t, err)
			require.False(t, slices.Contains(listed.Groups(), group))
		})
	}
}

// TestGroupErrorCodesOnTheWire: the fencing of a classic group as a client sees it,
// request by request: MEMBER_ID_REQUIRED for a new member (JoinGroup v4+), then
// ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID and FENCED_INSTANCE_ID on commits and
// heartbeats (nothing written), REBALANCE_IN_PROGRESS once another member joins,
// INCONSISTENT_GROUP_PROTOCOL for a group id held by streamd members, GROUP_ID_NOT_FOUND
// and INVALID_GROUP_ID from the admin APIs.
func TestGroupErrorCodesOnTheWire(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	cl := newClient(t, []string{ts.addr})
	topic, group := testdb.Name("kg"), testdb.Name("kg")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, 2))
	produceTopic(t, pool, topic, 2, 5)

	// A second client for the member that waits in JoinGroup while the first one goes
	// on: a client's requests on one connection are answered in order.
	other := newClient(t, []string{ts.addr})
	joinWith := func(cl *kgo.Client, memberID, instanceID string) *kmsg.JoinGroupResponse {
		req := kmsg.NewPtrJoinGroupRequest()
		req.Group, req.MemberID, req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = group, memberID, 10000, 10000
		if instanceID != "" {
			req.InstanceID = &instanceID
		}
		req.ProtocolType = "consumer"
		meta := kmsg.NewConsumerMemberMetadata()
		meta.Topics = []string{topic}
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name, p.Metadata = "range", meta.AppendTo(nil)
		req.Protocols = append(req.Protocols, p)
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		return resp
	}
	join := func(memberID, instanceID string) *kmsg.JoinGroupResponse { return joinWith(cl, memberID, instanceID) }
	commit := func(memberID, instanceID string, generation int32, offset int64) int16 {
		req := kmsg.NewPtrOffsetCommitRequest()
		req.Group, req.MemberID, req.Generation = group, memberID, generation
		if instanceID != "" {
			req.InstanceID = &instanceID
		}
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset = 0, offset
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		return resp.Topics[0].Partitions[0].ErrorCode
	}
	heartbeat := func(memberID, instanceID string, generation int32) int16 {
		req := kmsg.NewPtrHeartbeatRequest()
		req.Group, req.MemberID, req.Generation = group, memberID, generation
		if instanceID != "" {
			req.InstanceID = &instanceID
		}
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		return resp.ErrorCode
	}
	committedAt := func() int64 {
		adm := kadm.NewClient(cl)
		offs, err := adm.FetchOffsets(ctx, group)
		require.NoError(t, err)
		o, ok := offs.Lookup(topic, 0)
		if !ok {
			return -1
		}
		return o.At
	}

	first := join("", "")
	require.Equal(t, kerr.MemberIDRequired.Code, first.ErrorCode)
	require.NotEmpty(t, first.MemberID)
	joined := join(first.MemberID, "")
	require.Zero(t, joined.ErrorCode)
	require.Equal(t, int32(1), joined.Generation)
	require.Equal(t, first.MemberID, joined.LeaderID)
	require.Equal(t, kerr.RebalanceInProgress.Code, commit(joined.MemberID, "", 1, 2), "before SyncGroup")

	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.MemberID, sync.Generation = group, joined.MemberID, 1
	a := kmsg.NewSyncGroupRequestGroupAssignment()
	a.MemberID, a.MemberAssignment = joined.MemberID, []byte("mine")
	sync.GroupAssignment = append(sync.GroupAssignment, a)
	sresp, err := sync.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Zero(t, sresp.ErrorCode)
	require.Equal(t, []byte("mine"), sresp.MemberAssignment)

	require.Zero(t, commit(joined.MemberID, "", 1, 2))
	require.Equal(t, kerr.IllegalGeneration.Code, commit(joined.MemberID, "", 7, 3))
	require.Equal(t, kerr.UnknownMemberID.Code, commit("nobody", "", 1, 3))
	require.Equal(t, kerr.OffsetOutOfRange.Code, commit(joined.MemberID, "", 1, 6))
	require.Equal(t, int64(2), committedAt(), "refused commits wrote nothing")
	require.Zero(t, heartbeat(joined.MemberID, "", 1))
	require.Equal(t, kerr.IllegalGeneration.Code, heartbeat(joined.MemberID, "", 2))
	require.Equal(t, kerr.UnknownMemberID.Code, heartbeat("nobody", "", 1))

	// A static member joins (no MEMBER_ID_REQUIRED for static members): the group
	// rebalances, which the first member learns from its heartbeat.
	staticDone := make(chan *kmsg.JoinGroupResponse, 1)
	go func() { staticDone <- joinWith(other, "", "static-1") }()
	require.Eventually(t, func() bool { return heartbeat(joined.MemberID, "", 1) == kerr.RebalanceInProgress.Code },
		30*time.Second, 10*time.Millisecond)
	require.Zero(t, commit(joined.MemberID, "", 1, 3), "commits of the current generation go on while it rebalances")
	rejoined := join(joined.MemberID, "")
	static := <-staticDone
	require.Zero(t, rejoined.ErrorCode)
	require.Zero(t, static.ErrorCode)
	require.Equal(t, int32(2), static.Generation)
	require.Len(t, rejoined.Members, 2)
	require.Equal(t, kerr.IllegalGeneration.Code, commit(joined.MemberID, "", 1, 4), "the old generation is fenced")
	require.Equal(t, kerr.FencedInstanceID.Code, heartbeat("not-the-holder", "static-1", 2))
	require.Equal(t, int64(3), committedAt())

	// A streamd member holds another group id: a classic member cannot join it.
	native := testdb.Name("kg")
	nc, err := consumergroup.New(pool, &consumergroup.Config{Stream: topic, Group: native})
	require.NoError(t, err)
	nctx, stopNative := context.WithCancel(ctx)
	nativeDone := make(chan error, 1)
	go func() {
		nativeDone <- nc.Run(nctx, func(context.Context, *consumergroup.Batch) error { return nil })
	}()
	t.Cleanup(func() { stopNative(); <-nativeDone })
	require.Eventually(t, func() bool {
		d, err := consumergroup.NewAdmin(pool).DescribeGroup(ctx, topic, native)
		return err == nil && len(d.MemberStatus) == 1
	}, 30*time.Second, 10*time.Millisecond)
	group = native
	require.Equal(t, kerr.InconsistentGroupProtocol.Code, join("", "static-x").ErrorCode)

	adm := kadm.NewClient(cl)
	none := testdb.Name("none")
	deleted, err := adm.DeleteGroups(ctx, none, "bad group id")
	require.NoError(t, err)
	require.ErrorIs(t, deleted[none].Err, kerr.GroupIDNotFound)
	require.ErrorIs(t, deleted["bad group id"].Err, kerr.InvalidGroupID)
}

// TestKIP848AndNativeMembersShareAGroup: a franz-go consumer with the KIP-848 protocol
// (ServerSideBalancer) and a streamd Go consumer (consumergroup.Consumer) are members of
// one group: the server-side assignor splits the partitions between them, every record
// is processed, and ConsumerGroupDescribe (kadm) shows both members.
func TestKIP848AndNativeMembersShareAGroup(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{ConsumerGroupSessionTimeout: 3 * time.Second,
		ConsumerGroupHeartbeatInterval: 200 * time.Millisecond})
	ctx := testCtx(t)
	topic, group := testdb.Name("kg"), testdb.Name("kg")
	const partitions = 4
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, partitions))
	table := processedTable(t, pool)
	record := func(ctx context.Context, member string, parts []int32, offs []int64) error {
		_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{table}.Sanitize()+` (partition, "offset", member)
			SELECT p, o, $3 FROM unnest($1::int[], $2::bigint[]) AS u(p, o)`, parts, offs, member)
		return err
	}
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })

	// The streamd member.
	nc, err := consumergroup.New(pool, &consumergroup.Config{Stream: topic, Group: group})
	require.NoError(t, err)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = nc.Run(cctx, func(ctx context.Context, b *consumergroup.Batch) error {
			parts, offs := make([]int32, len(b.Events)), make([]int64, len(b.Events))
			for i, e := range b.Events {
				parts[i], offs[i] = b.Partition, e.Offset
			}
			return record(ctx, "native", parts, offs)
		})
	}()
	// The KIP-848 member.
	cl := newClient(t, []string{ts.addr}, append(groupClientOpts(group, topic, kgo.RangeBalancer()),
		kgo.ServerSideBalancer(), kgo.BlockRebalanceOnPoll(), kgo.FetchMaxWait(200*time.Millisecond))...)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for cctx.Err() == nil {
			fetches := cl.PollRecords(cctx, 50)
			if fetches.IsClientClosed() {
				return
			}
			if recs := fetches.Records(); len(recs) > 0 {
				parts, offs := make([]int32, len(recs)), make([]int64, len(recs))
				for i, r := range recs {
					parts[i], offs[i] = r.Partition, r.Offset
				}
				if record(cctx, "kip848", parts, offs) == nil {
					_ = cl.CommitRecords(cctx, recs...)
				}
			}
			cl.AllowRebalance()
		}
	}()

	// Records keep coming until both members have processed some: a member that has
	// every partition to itself may read all of a single burst before the other one
	// is assigned anything.
	deadline := time.Now().Add(60 * time.Second)
	for membersRecorded(t, pool, table) < 2 {
		require.True(t, time.Now().Before(deadline), "both members process")
		produceTopic(t, pool, topic, partitions, 10)
		for until := time.Now().Add(time.Second); membersRecorded(t, pool, table) < 2 && time.Now().Before(until); {
			time.Sleep(20 * time.Millisecond) // poll interval
		}
	}
	require.Eventually(t, func() bool { return groupLagZero(t, pool, topic, group) }, 60*time.Second, 20*time.Millisecond)
	requireAllProcessed(t, pool, topic, table)

	described, err := newAdmin(t, ts.addr).DescribeConsumerGroups(ctx, group)
	require.NoError(t, err)
	dg := described[group]
	require.NoError(t, dg.Err)
	require.Len(t, dg.Members, 2)
	total := 0
	for _, m := range dg.Members {
		for tp, ps := range m.Assignment {
			require.Equal(t, topic, tp)
			total += len(ps)
		}
	}
	require.Equal(t, partitions, total, "the partitions are split between the two members")
}
