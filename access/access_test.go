package access_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

func TestTokens(t *testing.T) {
	t.Parallel()
	tokens := access.Tokens{"alice-token-0123456789": "alice", "alice-token-new-0123456": "alice", "bob-token-0123456789ab": "bob"}
	require.NoError(t, tokens.Validate())

	p, ok := tokens.Principal("bob-token-0123456789ab")
	require.True(t, ok)
	require.Equal(t, "bob", p)
	_, ok = tokens.Principal("bob-token-0123456789a")
	require.False(t, ok, "a prefix of a token is not a token")
	_, ok = tokens.Principal("")
	require.False(t, ok)

	require.True(t, tokens.Check("alice", "alice-token-new-0123456"), "either of alice's tokens")
	require.True(t, tokens.Check("alice", "alice-token-0123456789"))
	require.False(t, tokens.Check("alice", "bob-token-0123456789ab"), "another principal's token")
	require.False(t, tokens.Check("carol", "bob-token-0123456789ab"))
	require.Equal(t, []string{"alice-token-0123456789", "alice-token-new-0123456"}, tokens.Of("alice"))
	require.Empty(t, tokens.Of("carol"))
	require.Equal(t, []string{"alice", "bob"}, tokens.Principals())

	err := access.Tokens{"s3cr3t": "carol"}.Validate()
	require.ErrorContains(t, err, `principal "carol"`)
	require.NotContains(t, err.Error(), "s3cr3t", "the error never shows the token")
	require.ErrorContains(t, access.Tokens{"long-enough-token-0123": ""}.Validate(), "empty principal")
}

// TestAuthorizerFollowsAccessControl: the one rule of the HTTP API and the Kafka
// listener. Admin may do all; readers read, writers write, admins all three; "*"
// is every principal; a stream without access control, or that does not exist,
// allows nobody but admin; a stored value that does not fit refuses all but admin;
// stream-less actions are admin's. Decide answers the same for several streams in
// one call.
func TestAuthorizerFollowsAccessControl(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	sc := streams.NewClient(pool, nil)
	store := streamconfig.NewStore(pool)
	open, shared, bare, broken := testdb.Name("acl-open"), testdb.Name("acl-shared"), testdb.Name("acl-bare"), testdb.Name("acl-broken")
	for _, s := range []string{open, shared, bare, broken} {
		require.NoError(t, sc.CreateStream(ctx, s, 1))
	}
	require.NoError(t, store.Set(ctx, open, &streamconfig.Config{AccessControl: &streamconfig.AccessControl{
		Readers: []string{"alice"}, Writers: []string{"bob"}, Admins: []string{"carol"}}}))
	require.NoError(t, store.Set(ctx, shared, &streamconfig.Config{AccessControl: &streamconfig.AccessControl{Readers: []string{"*"}}}))
	require.NoError(t, store.Set(ctx, broken, &streamconfig.Config{AccessControl: &streamconfig.AccessControl{Readers: []string{"alice"}}}))
	_, err := pool.Exec(ctx, `UPDATE streamd.stream_configurations SET access_control_config = '{"readers": "alice"}' WHERE stream_name = $1`, broken)
	require.NoError(t, err)

	az := access.NewAuthorizer(pool)
	missing := testdb.Name("acl-missing")
	cases := []struct {
		principal, stream string
		action            access.Action
		allowed           bool
	}{
		{"alice", open, access.Read, true},
		{"alice", open, access.Write, false},
		{"alice", open, access.Admin, false},
		{"bob", open, access.Write, true},
		{"bob", open, access.Read, false},
		{"carol", open, access.Read, true},
		{"carol", open, access.Write, true},
		{"carol", open, access.Admin, true},
		{"dave", shared, access.Read, true},
		{"dave", shared, access.Write, false},
		{"alice", bare, access.Read, false},
		{"alice", missing, access.Read, false},
		{"alice", broken, access.Read, false},
		{"alice", "", access.Admin, false},
		{access.AdminPrincipal, open, access.Admin, true},
		{access.AdminPrincipal, bare, access.Write, true},
		{access.AdminPrincipal, missing, access.Read, true},
		{access.AdminPrincipal, broken, access.Read, true},
		{access.AdminPrincipal, "", access.Admin, true},
	}
	byPrincipal := map[string][]string{}
	for _, c := range cases {
		err := az.Authorize(ctx, c.principal, c.stream, c.action)
		if c.allowed {
			require.NoError(t, err, "%s %s %s", c.principal, c.action, c.stream)
		} else {
			require.ErrorIs(t, err, access.ErrForbidden, "%s %s %s", c.principal, c.action, c.stream)
		}
		if c.stream != "" {
			byPrincipal[c.principal] = append(byPrincipal[c.principal], c.stream)
		}
	}
	require.ErrorContains(t, az.Authorize(ctx, "alice", broken, access.Read), "cannot be read")

	// Decide over all of a principal's streams at once answers as Authorize did.
	for _, c := range cases {
		if c.stream == "" {
			continue
		}
		d, err := az.Decide(ctx, c.principal, byPrincipal[c.principal])
		require.NoError(t, err)
		require.Equal(t, c.allowed, d.Allows(c.stream, c.action), "Decide: %s %s %s", c.principal, c.action, c.stream)
	}
	d, err := az.Decide(ctx, "alice", []string{bare})
	require.NoError(t, err)
	require.False(t, d.Allows(open, access.Read), "a stream Decide was not asked about is refused")
}
