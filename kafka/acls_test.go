package kafka

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

// kadm's ACL calls act on access_control_config: CreateACLs adds principals to the
// topic's readers (READ), writers (WRITE) and admins (ALL), which then decide
// requests; DescribeACLs lists them; DeleteACLs removes what its filter matches.
// What cannot be mapped (DENY, a host, PREFIXED, a group, DESCRIBE, an unknown
// topic) is INVALID_REQUEST and writes nothing; a principal other than admin gets
// CLUSTER_AUTHORIZATION_FAILED.
func TestACLsMapOntoAccessControl(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{Tokens: testTokens()})
	ctx := testCtx(t)
	adm := kadm.NewClient(saslClient(t, ts.addr, "PLAIN", access.AdminPrincipal, adminToken))
	store := streamconfig.NewStore(pool)
	topic := testdb.Name("acl")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, 1))

	// Before: rita may not write.
	rita := saslClient(t, ts.addr, "PLAIN", testReader, readerToken, kgo.DefaultProduceTopic(topic))
	require.ErrorIs(t, rita.ProduceSync(ctx, &kgo.Record{Value: []byte("no")}).FirstErr(), kerr.TopicAuthorizationFailed)

	created, err := adm.CreateACLs(ctx, kadm.NewACLs().Topics(topic).Allow("User:"+testReader).Operations(kadm.OpRead, kadm.OpWrite))
	require.NoError(t, err)
	for _, c := range created {
		require.NoError(t, c.Err, "%+v", c)
	}
	for _, more := range []*kadm.ACLBuilder{
		kadm.NewACLs().Topics(topic).Allow("User:*").Operations(kadm.OpRead),
		kadm.NewACLs().Topics(topic).Allow("User:" + testWriter).Operations(kadm.OpAll),
	} {
		created, err = adm.CreateACLs(ctx, more)
		require.NoError(t, err)
		require.NoError(t, created[0].Err)
	}
	cfg, err := store.Get(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, &streamconfig.AccessControl{Readers: []string{testReader, "*"}, Writers: []string{testReader},
		Admins: []string{testWriter}}, cfg.AccessControl)
	require.NoError(t, rita.ProduceSync(ctx, &kgo.Record{Value: []byte("yes")}).FirstErr(), "the ACL decides the next request")

	described, err := adm.DescribeACLs(ctx, kadm.NewACLs().Topics(topic).Allow().AllowHosts().Operations(kadm.OpAny).ResourcePatternType(kadm.ACLPatternAny))
	require.NoError(t, err)
	got := map[string]bool{}
	for _, d := range described {
		require.NoError(t, d.Err)
		for _, acl := range d.Described {
			require.Equal(t, topic, acl.Name)
			require.Equal(t, "*", acl.Host)
			got[acl.Principal+" "+acl.Operation.String()] = true
		}
	}
	require.Equal(t, map[string]bool{"User:rita READ": true, "User:rita WRITE": true, "User:* READ": true, "User:wally ALL": true}, got)

	for _, bad := range []*kadm.ACLBuilder{
		kadm.NewACLs().Topics(topic).Deny("User:" + testNobody).Operations(kadm.OpRead),
		kadm.NewACLs().Topics(topic).Allow("User:" + testNobody).AllowHosts("10.0.0.1").Operations(kadm.OpRead),
		kadm.NewACLs().Topics(topic).Allow("User:" + testNobody).Operations(kadm.OpRead).ResourcePatternType(kadm.ACLPatternPrefixed),
		kadm.NewACLs().Groups("g").Allow("User:" + testNobody).Operations(kadm.OpRead),
		kadm.NewACLs().Topics(topic).Allow("User:" + testNobody).Operations(kadm.OpDescribe),
		kadm.NewACLs().Topics(topic).Allow("Group:" + testNobody).Operations(kadm.OpRead),
		kadm.NewACLs().Topics(testdb.Name("no-such-topic")).Allow("User:" + testNobody).Operations(kadm.OpRead),
	} {
		res, err := adm.CreateACLs(ctx, bad)
		require.NoError(t, err)
		require.ErrorIs(t, res[0].Err, kerr.InvalidRequest, "%+v", res[0])
	}
	after, err := store.Get(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, cfg.AccessControl, after.AccessControl, "nothing written")

	// Only admin may touch ACLs.
	ritaAdm := kadm.NewClient(rita)
	res, err := ritaAdm.CreateACLs(ctx, kadm.NewACLs().Topics(topic).Allow("User:"+testReader).Operations(kadm.OpAll))
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, kerr.ClusterAuthorizationFailed)
	desc, err := ritaAdm.DescribeACLs(ctx, kadm.NewACLs().Topics(topic).Allow().AllowHosts().Operations(kadm.OpAny))
	require.NoError(t, err)
	require.ErrorIs(t, desc[0].Err, kerr.ClusterAuthorizationFailed)

	// DeleteACLs: rita's WRITE goes, the rest stays.
	deleted, err := adm.DeleteACLs(ctx, kadm.NewACLs().Topics(topic).Allow("User:"+testReader).AllowHosts().Operations(kadm.OpWrite))
	require.NoError(t, err)
	var matched int
	for _, d := range deleted {
		require.NoError(t, d.Err)
		matched += len(d.Deleted)
	}
	require.Equal(t, 1, matched)
	cfg, err = store.Get(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, &streamconfig.AccessControl{Readers: []string{testReader, "*"}, Admins: []string{testWriter}}, cfg.AccessControl)
	require.ErrorIs(t, rita.ProduceSync(ctx, &kgo.Record{Value: []byte("no more")}).FirstErr(), kerr.TopicAuthorizationFailed)
}
