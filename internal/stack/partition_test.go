package stack

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

// environOf returns the environment a child was started with.
func environOf(t *testing.T, s *Stack, instance string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", s.Pid(instance)))
	require.NoError(t, err)
	env := map[string]string{}
	for _, kv := range strings.Split(string(raw), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

// logHas reports whether instance's log holds text after offset bytes.
func logHas(s *Stack, instance string, offset int, text string) bool {
	b, err := os.ReadFile(s.LogPath(instance))
	return err == nil && len(b) > offset && strings.Contains(string(b[offset:]), text)
}

func logSize(s *Stack, instance string) int {
	fi, err := os.Stat(s.LogPath(instance))
	if err != nil {
		return 0
	}
	return int(fi.Size())
}

// TestPartitionOfOneReplica (issue 17, chaos's partition kind): with
// Config.Partitions every service replica reaches PostgreSQL and NATS
// through proxies of its own, so one replica is cut alone: cut from
// PostgreSQL (a blackhole) it fences itself while its peer serves, and
// trips booked meanwhile end whole; healed, it beats again. Cut from NATS
// and healed, the system goes on. What Cut refuses is refused by name.
func TestPartitionOfOneReplica(t *testing.T) {
	dir := tempDir(t)
	var log syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{
		Dir: dir, Binary: binary, Replicas: 2, Partitions: true,
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"hotel-2", "payment-2", "car-2"} {
				b, _ := os.ReadFile(s.LogPath(name))
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				t.Logf("==== %s log (tail)\n%s", name, b)
			}
		}
	})

	var want []string
	for _, p := range Services {
		want = append(want, p, p+"-2")
	}
	require.Equal(t, want, s.Partitionable(), "every service replica, not the simulators")

	// Each replica is given its own proxies; the tools keep the real URLs.
	realPG, err := url.Parse(s.RoleURL("hotel"))
	require.NoError(t, err)
	seen := map[string]string{}
	for _, name := range []string{"hotel", "hotel-2", "payment-2"} {
		env := environOf(t, s, name)
		pg, err := url.Parse(env["DATABASE_URL"])
		require.NoError(t, err)
		require.NotEqual(t, realPG.Host, pg.Host, "%s reaches PostgreSQL through a proxy", name)
		require.NotEqual(t, s.NATSURL, env["NATS_URL"], "%s reaches NATS through a proxy", name)
		for _, addr := range []string{pg.Host, env["NATS_URL"]} {
			require.NotContains(t, seen, addr, "%s shares a proxy with %s", name, seen[addr])
			seen[addr] = name
		}
	}
	require.Equal(t, s.NATSURL, s.Env()["NATS_URL"])

	require.ErrorContains(t, s.Cut("sim", CutPostgresBlackhole), `"sim" is no service replica`)
	require.ErrorContains(t, s.Cut("hotel-2", "pg-unplugged"), `unknown shape "pg-unplugged"`)
	require.ErrorIs(t, (&Stack{}).Cut("hotel", CutPostgresReset), ErrNoProxies)

	card := "tok_partition_" + strings.ToLower(ulid.Make().String()[16:])
	n := 0
	bookWhole := func(what string) {
		t.Helper()
		n++
		key := fmt.Sprintf("%s-%d", card, n)
		var id string
		testenv.Eventually(t, func() bool {
			id, err = book(ctx, s.URL("trips"), key, tripBody(card, fmt.Sprintf("partition%d@example.com", n)))
			return err == nil && id != ""
		}, "POST /trips accepted (%s)", what)
		status := settled(t, s.URL("trips"), id)
		o := judge(t, s, id, status, card)
		require.Equal(t, demo.Whole, o.Verdict, "%s: %+v", what, o)
		require.Equal(t, 1, o.Charges, "%s: %+v", what, o)
		require.Equal(t, 1, o.Mails, "%s: %+v", what, o)
	}

	// Cut from PostgreSQL without a reset: the replica fences itself.
	off := logSize(s, "hotel-2")
	cutAt := time.Now()
	require.NoError(t, s.Cut("hotel-2", CutPostgresBlackhole))
	testenv.Eventually(t, func() bool { return logHas(s, "hotel-2", off, "no beat confirmed by PostgreSQL") },
		"hotel-2, cut from PostgreSQL, fences itself")
	t.Logf("hotel-2 fenced itself %.1f s after the cut", time.Since(cutAt).Seconds())
	require.False(t, logHas(s, "hotel", 0, "no beat confirmed by PostgreSQL"), "its peer is not cut")
	bookWhole("hotel-2 cut from PostgreSQL")
	off = logSize(s, "hotel-2")
	require.NoError(t, s.Heal("hotel-2"))
	// Healed, it beats again: on its session, or on a new one when the cut
	// outlived the old one (the lock is then taken again).
	testenv.Eventually(t, func() bool {
		return logHas(s, "hotel-2", off, "beat confirmed again") || logHas(s, "hotel-2", off, "lock taken again")
	}, "hotel-2, healed, beats again")

	// Cut from PostgreSQL with resets, and from NATS, then healed.
	off = logSize(s, "payment-2")
	require.NoError(t, s.Cut("payment-2", CutPostgresReset))
	testenv.Eventually(t, func() bool { return logHas(s, "payment-2", off, "no beat confirmed by PostgreSQL") },
		"payment-2, its PostgreSQL connections reset, fences itself")
	require.NoError(t, s.Cut("car-2", CutBothBlackhole))
	require.NoError(t, s.Cut("trips-2", CutNATSBlackhole))
	bookWhole("payment-2 reset, car-2 cut from both, trips-2 cut from NATS")
	off = logSize(s, "payment-2")
	for _, name := range []string{"payment-2", "car-2", "trips-2"} {
		require.NoError(t, s.Heal(name))
	}
	testenv.Eventually(t, func() bool { return logHas(s, "payment-2", off, "beat confirmed again") },
		"payment-2, healed, beats again")
	bookWhole("healed")
}
