package doctor_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/doctor"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// goodStream is the stream config events.EnsureStreams creates for name.
func goodStream(name string) jetstream.StreamConfig {
	subs := events.Default.StreamSubjects()
	subs[events.StreamDeadLetter] = []string{events.DeadLetterSubjectPrefix + ".>"}
	return jetstream.StreamConfig{
		Name: name, Subjects: subs[name], Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage,
		Duplicates: events.DuplicateWindow, MaxAge: events.MaxAge, Discard: jetstream.DiscardOld,
	}
}

// inboxConsumer is the consumer config an inbox creates (inbox.Inbox.Run).
func inboxConsumer(name string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: inbox.AckWaitDefault,
		MaxDeliver: -1, DeliverPolicy: jetstream.DeliverAllPolicy, MaxAckPending: 1000,
	}
}

// streams starts an embedded server with the default streams
// (events.EnsureStreams).
func streams(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	_, nc, js := testenv.JetStream(t)
	return nc, js
}

// replaceStream deletes stream name and creates it again with cfg.
func replaceStream(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, js.DeleteStream(ctx, cfg.Name))
	_, err := js.CreateStream(ctx, cfg)
	require.NoError(t, err)
}

// TestRules makes each bad configuration on an embedded NATS server and
// checks that it is the one finding, with its reason and source.
func TestRules(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, js jetstream.JetStream)
		cfg   func(*doctor.Config)
		rule  string
		obj   string
		// reason and source must contain these.
		reason, source []string
	}{
		{
			name: "duplicate window too short for the relay backoff",
			setup: func(t *testing.T, js jetstream.JetStream) {
				c := goodStream(events.StreamHotel)
				c.Duplicates = 30 * time.Second
				replaceStream(t, js, c)
			},
			rule: doctor.RuleRelayBackoff, obj: "stream HOTEL",
			reason: []string{"longest backoff 20s", "30s duplicate window"},
			source: []string{"Message Deduplication", "nats-server #7302"},
		},
		{
			name: "relay backoff configured too long",
			cfg:  func(c *doctor.Config) { c.RelayBackoffMax = time.Minute; c.Streams = []string{events.StreamCar} },
			rule: doctor.RuleRelayBackoff, obj: "stream CAR",
			reason: []string{"longest backoff 1m0s", "2m0s duplicate window"},
			source: []string{"field notes, JetStream"},
		},
		{
			name: "AckWait shorter than the slowest handler",
			setup: func(t *testing.T, js jetstream.JetStream) {
				c := inboxConsumer("payment")
				c.AckWait = time.Second
				_, err := js.CreateConsumer(context.Background(), events.StreamHotel, c)
				require.NoError(t, err)
			},
			rule: doctor.RuleAckWaitShort, obj: "consumer payment on HOTEL",
			reason: []string{"AckWait 1s", "slowest handler (2s)"},
			source: []string{"nats.go #1929"},
		},
		{
			name: "inboxes configured with an AckWait shorter than the slowest handler",
			cfg:  func(c *doctor.Config) { c.InboxAckWait = time.Second },
			rule: doctor.RuleAckWaitShort, obj: "inbox configuration",
			reason: []string{"AckWait 1s", "slowest handler (2s)"},
			source: []string{"nats.go #1929"},
		},
		{
			name: "AckWait left to the default",
			setup: func(t *testing.T, js jetstream.JetStream) {
				c := inboxConsumer("payment")
				c.AckWait = 0
				_, err := js.CreateConsumer(context.Background(), events.StreamHotel, c)
				require.NoError(t, err)
			},
			rule: doctor.RuleAckWaitDefault, obj: "consumer payment on HOTEL",
			reason: []string{"server's default 30 s"},
			source: []string{"set both explicitly per consumer"},
		},
		{
			name: "MaxDeliver left to the default on a consumer that is no inbox",
			setup: func(t *testing.T, js jetstream.JetStream) {
				_, err := js.CreateConsumer(context.Background(), events.StreamCar, jetstream.ConsumerConfig{
					Durable: "audit", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second,
				})
				require.NoError(t, err)
			},
			rule: doctor.RuleMaxDeliverDefault, obj: "consumer audit on CAR",
			reason: []string{"MaxDeliver is unlimited"},
			source: []string{"MaxDeliver defaults to unlimited"},
		},
		{
			name: "an inbox consumer with a server MaxDeliver",
			setup: func(t *testing.T, js jetstream.JetStream) {
				c := inboxConsumer("car")
				c.MaxDeliver = 5
				_, err := js.CreateConsumer(context.Background(), events.StreamPayment, c)
				require.NoError(t, err)
			},
			rule: doctor.RuleMaxDeliverServer, obj: "consumer car on PAYMENT",
			reason: []string{"MaxDeliver 5", "parks the event itself at delivery 25"},
			source: []string{"no dead-letter queue"},
		},
		{
			name: "work-queue stream",
			setup: func(t *testing.T, js jetstream.JetStream) {
				c := goodStream(events.StreamCar)
				c.Retention = jetstream.WorkQueuePolicy
				replaceStream(t, js, c)
			},
			rule: doctor.RuleStreamRetention, obj: "stream CAR",
			reason: []string{"work-queue retention", "use limits retention"},
			source: []string{"not work-queue"},
		},
		{
			name: "memory stream",
			setup: func(t *testing.T, js jetstream.JetStream) {
				c := goodStream(events.StreamDeadLetter)
				c.Storage = jetstream.MemoryStorage
				replaceStream(t, js, c)
			},
			rule: doctor.RuleStreamStorage, obj: "stream DEADLETTER",
			reason: []string{"loses every event when the NATS server restarts"},
			source: []string{"StorageType"},
		},
		{
			name: "max age shorter than the longest replay",
			setup: func(t *testing.T, js jetstream.JetStream) {
				c := goodStream(events.StreamTrips)
				c.MaxAge = 24 * time.Hour
				replaceStream(t, js, c)
			},
			rule: doctor.RuleStreamMaxAge, obj: "stream TRIPS",
			reason: []string{"max age 24h0m0s", "longest replay (720h0m0s)"},
			source: []string{"every replay"},
		},
		{
			name: "max age longer than the inbox retention",
			cfg: func(c *doctor.Config) {
				c.InboxRetention = 7 * 24 * time.Hour
				c.Streams = []string{events.StreamTrips}
			},
			rule: doctor.RuleStreamMaxAge, obj: "stream TRIPS",
			reason: []string{"max age 720h0m0s outlasts the inbox retention 168h0m0s", "applied twice"},
			source: []string{"Inbox retention must outlast"},
		},
		{
			name: "replicas above the cluster size",
			cfg:  func(c *doctor.Config) { c.StreamReplicas = 3 },
			rule: doctor.RuleStreamReplicas, obj: "stream configuration",
			reason: []string{"3 replicas", "the cluster has 1 server(s)"},
			source: []string{"Clustering"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nc, js := streams(t)
			if tc.setup != nil {
				tc.setup(t, js)
			}
			cfg := doctor.DefaultConfig(events.Selected())
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			fs, err := doctor.Check(context.Background(), nc, js, cfg)
			require.NoError(t, err)
			require.Len(t, fs, 1, "%v", fs)
			f := fs[0]
			require.Equal(t, tc.rule, f.Rule)
			require.Equal(t, tc.obj, f.Object)
			for _, s := range tc.reason {
				require.Contains(t, f.Reason, s)
			}
			for _, s := range tc.source {
				require.Contains(t, f.Source, s)
			}
			err = doctor.Err(fs)
			require.ErrorIs(t, err, doctor.ErrViolation)
			require.ErrorContains(t, err, tc.obj+": "+tc.rule+": ")
		})
	}
}

// TestDeadLetterWindowNotTheRelays: the relay never publishes to the
// dead-letter stream, so its duplicate window is not held against the
// relay's backoff.
func TestDeadLetterWindowNotTheRelays(t *testing.T) {
	nc, js := streams(t)
	c := goodStream(events.StreamDeadLetter)
	c.Duplicates = 30 * time.Second
	replaceStream(t, js, c)
	fs, err := doctor.Check(context.Background(), nc, js, doctor.DefaultConfig(events.Selected()))
	require.NoError(t, err)
	require.Empty(t, fs)
}

// TestExplicitConsumerPasses: a durable consumer that is no inbox passes
// when it sets AckWait and MaxDeliver itself.
func TestExplicitConsumerPasses(t *testing.T) {
	nc, js := streams(t)
	_, err := js.CreateConsumer(context.Background(), events.StreamCar, jetstream.ConsumerConfig{
		Durable: "audit", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second, MaxDeliver: 5,
	})
	require.NoError(t, err)
	fs, err := doctor.Check(context.Background(), nc, js, doctor.DefaultConfig(events.Selected()))
	require.NoError(t, err)
	require.Empty(t, fs)
}

// TestMissingStreams: tripsaga doctor (RequireStreams) names every stream
// no service has created yet; at a service's start they are no finding.
func TestMissingStreams(t *testing.T) {
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv, natsauth.Admin)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	cfg := doctor.DefaultConfig(events.Selected())
	fs, err := doctor.Check(context.Background(), nc, js, cfg)
	require.NoError(t, err)
	require.Empty(t, fs)

	cfg.RequireStreams = true
	fs, err = doctor.Check(context.Background(), nc, js, cfg)
	require.NoError(t, err)
	var objs []string
	for _, f := range fs {
		require.Equal(t, doctor.RuleStreamMissing, f.Rule)
		objs = append(objs, f.Object)
	}
	want := []string{"stream " + events.StreamDeadLetter}
	for s := range events.Selected().StreamSubjects() {
		want = append(want, "stream "+s)
	}
	slices.Sort(want)
	require.Equal(t, want, objs, "every stream of the catalogue and DEADLETTER")
}

// TestDefaultConfigurationPasses: the streams of events.EnsureStreams and
// the consumers the services' real inboxes create (inbox.Inbox.Run), plus
// a replay's ordered consumer, give no finding.
func TestDefaultConfigurationPasses(t *testing.T) {
	nc, js := streams(t)
	pool, _ := testenv.SchemaPool(t, "hotel", tripsql.SetSaga)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	services := []string{"hotel", "payment", "car", "trips", "reconciler"}
	var ins []*inbox.Inbox
	want := 0
	for _, svc := range services {
		types := events.Default.Consumes(svc)
		for stream, filters := range events.Default.Streams(types) {
			var st []string
			for _, typ := range types {
				if et, _ := events.Default.Lookup(typ); et.Stream == stream {
					st = append(st, typ)
				}
			}
			in, err := inbox.New(inbox.Config{
				Name: svc, Stream: stream, FilterSubjects: filters, Types: st, Pool: pool, JetStream: js,
				Handler: func(context.Context, pgx.Tx, event.Event) error { return nil },
			})
			require.NoError(t, err)
			ins = append(ins, in)
			want++
		}
	}
	go func() {
		defer close(done)
		for _, in := range ins {
			go func() { _ = in.Run(ctx) }()
		}
		<-ctx.Done()
	}()
	s, err := js.Stream(context.Background(), events.StreamTrips)
	require.NoError(t, err)
	_, err = s.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	count := func() int {
		n := 0
		for _, name := range doctor.DefaultConfig(events.Selected()).Streams {
			st, err := js.Stream(context.Background(), name)
			if err != nil {
				return -1
			}
			for ci := range st.ListConsumers(context.Background()).Info() {
				if ci.Config.Durable != "" {
					n++
				}
			}
		}
		return n
	}
	testenv.Eventually(t, func() bool { return count() == want }, "the inboxes' %d consumers", want)

	cfg := doctor.DefaultConfig(events.Selected())
	cfg.RequireStreams = true
	fs, err := doctor.Check(context.Background(), nc, js, cfg)
	require.NoError(t, err)
	require.Empty(t, fs)
	require.NoError(t, doctor.Err(fs))
	require.True(t, slices.Contains(cfg.Inboxes, "reconciler"))
}
