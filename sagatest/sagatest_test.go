package sagatest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/sagatest"
)

func TestMain(m *testing.M) { sagatest.Main(m) }

// TestPoolHasTheMachinerysTables: a pool of a schema migrated with the
// machinery's set reaches the outbox, the inbox and the saga steps in that
// schema (its search_path), in a database of its own per test.
func TestPoolHasTheMachinerysTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := sagatest.Pool(t, "shop", sagatest.MachinerySet)
	for _, table := range []string{"outbox", "inbox", "steps", "incidents"} {
		var schema string
		require.NoError(t, pool.QueryRow(ctx, "SELECT table_schema FROM information_schema.tables WHERE table_name = $1", table).Scan(&schema), table)
		require.Equal(t, "shop", schema, table)
	}
	var path string
	require.NoError(t, pool.QueryRow(ctx, "SHOW search_path").Scan(&path))
	require.Equal(t, "shop", path)

	other := sagatest.Pool(t, "shop")
	var n int
	require.NoError(t, other.QueryRow(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'shop'").Scan(&n))
	require.Zero(t, n, "another test's database: only the schema, no set asked")
}

// TestJetStreamHasTheCataloguesStreams: the embedded server holds every
// stream of the catalogue given, and takes a publish on one of its
// subjects with a PubAck.
func TestJetStreamHasTheCataloguesStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, _, js := sagatest.JetStream(t, events.Default)
	for name := range events.Default.StreamSubjects() {
		_, err := js.Stream(ctx, name)
		require.NoError(t, err, name)
	}
	ack, err := js.Publish(ctx, "hotel.held.T-1", []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, events.StreamHotel, ack.Stream)
}
