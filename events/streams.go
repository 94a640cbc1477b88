package events

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream limits. Streams use limits retention (not work-queue) so that the
// trips service, the reconciler and replays each read every event.
const (
	// DuplicateWindow is JetStream's publish dedup window for Nats-Msg-Id
	// (NATS docs, "Message Deduplication"). The outbox relay's longest
	// backoff stays well inside it.
	DuplicateWindow = 2 * time.Minute
	// MaxAge is how long the streams keep events. Inbox rows must be kept
	// at least as long.
	MaxAge = 30 * 24 * time.Hour
)

// DuplicateWindowEnv names the environment variable that sets the event
// streams' duplicate window in milliseconds (default [DuplicateWindow]),
// from [MinDuplicateWindow] to [MaxAge]. Every process that creates or
// updates streams must be given the same value, or each start puts its
// own back. A shorter window costs nothing in correctness (the consumers'
// inboxes drop a duplicate the stream kept) and lets the outbox publish
// again, sooner, an event a stream lost (the server remembers a deleted
// message's id for the whole window and would store nothing before);
// chaos runs use it (`tripsaga chaos --duplicate-window`).
const DuplicateWindowEnv = "STREAM_DUPLICATE_WINDOW_MS"

// MinDuplicateWindow is the shortest duplicate window [DuplicateWindowEnv]
// may set: three times the outbox relay's default longest backoff (20 s,
// outbox.RelayBackoffMaxDefault), which must stay below half the window
// so that a relay's re-publish after a failed mark still falls inside it
// (the relay and `tripsaga doctor` check it).
const MinDuplicateWindow = 60 * time.Second

// StreamDuplicateWindow reads [DuplicateWindowEnv]: [DuplicateWindow] when
// unset; an error names a value that is not a whole number of
// milliseconds from [MinDuplicateWindow] to [MaxAge].
func StreamDuplicateWindow() (time.Duration, error) {
	v := os.Getenv(DuplicateWindowEnv)
	if v == "" {
		return DuplicateWindow, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if d := time.Duration(n) * time.Millisecond; err == nil && d >= MinDuplicateWindow && d <= MaxAge {
		return d, nil
	}
	return DuplicateWindow, fmt.Errorf("%s=%q: want milliseconds from %d to %d", DuplicateWindowEnv, v, MinDuplicateWindow.Milliseconds(), MaxAge.Milliseconds())
}

// StreamReplicasEnv names the environment variable that says how many
// replicas the streams are created with (default 1; 3 on a three-node
// JetStream cluster, as `tripsaga up --nats-cluster 3` sets it).
const StreamReplicasEnv = "STREAM_REPLICAS"

// MaxStreamReplicas is the most replicas JetStream allows a stream.
const MaxStreamReplicas = 5

// StreamReplicas reads [StreamReplicasEnv]: 1 when unset; an error names
// a value that is not a whole number from 1 to [MaxStreamReplicas].
func StreamReplicas() (int, error) {
	v := os.Getenv(StreamReplicasEnv)
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxStreamReplicas {
		return 1, fmt.Errorf("%s=%q: want a whole number from 1 to %d", StreamReplicasEnv, v, MaxStreamReplicas)
	}
	return n, nil
}

// EnsureStreams creates or updates the event streams of c and the
// dead-letter stream, with the replicas [StreamReplicas] reads from the
// environment (1 when unset or invalid; a process refuses an invalid value
// at start, see process.EnvFromOS). See [EnsureStreamsReplicas].
func EnsureStreams(ctx context.Context, js jetstream.JetStream, c Catalogue) error {
	n, _ := StreamReplicas()
	return EnsureStreamsReplicas(ctx, js, c, n)
}

// EnsureStreamsReplicas creates or updates the event streams of c and the
// dead-letter stream with replicas copies each. An existing stream with
// fewer replicas is raised to replicas; one with more keeps them (a
// process started without STREAM_REPLICAS, a tool say, never shrinks a
// cluster's streams).
func EnsureStreamsReplicas(ctx context.Context, js jetstream.JetStream, c Catalogue, replicas int) error {
	_, err := ApplyStreams(ctx, js, c, replicas)
	return err
}

// Stream actions of a [StreamChange].
const (
	StreamCreated   = "created"
	StreamUpdated   = "updated"
	StreamUnchanged = "unchanged"
)

// StreamChange is what was done to one stream: [StreamCreated],
// [StreamUpdated] (its configuration differed) or [StreamUnchanged], and
// the configuration it has now.
type StreamChange struct {
	Stream   string   `json:"stream"`
	Action   string   `json:"action"`
	Subjects []string `json:"subjects"`
	Replicas int      `json:"replicas"`
	// Owner is the service that creates and updates it ([Catalogue.StreamOwner]);
	// "" for the dead-letter stream, which every consumer creates when missing.
	Owner string `json:"owner,omitempty"`
}

// ApplyStreams creates or updates every event stream of c and the
// dead-letter stream, as [EnsureStreamsReplicas] does, in name order, and
// says what it did to each. It is idempotent: run again, every stream is
// unchanged. Only an identity that may create every stream
// (natsauth's admin) can run it.
func ApplyStreams(ctx context.Context, js jetstream.JetStream, c Catalogue, replicas int) ([]StreamChange, error) {
	var names []string
	for name := range c.StreamSubjects() {
		names = append(names, name)
	}
	names = append(names, StreamDeadLetter)
	slices.Sort(names)
	return ApplyStreamsOf(ctx, js, c, replicas, names, nil)
}

// StreamOwner is the service whose events stream holds, which creates and
// updates it, or "" when no event type of c is on stream (the dead-letter
// stream, which every consumer creates when missing).
func (c Catalogue) StreamOwner(stream string) string {
	for _, t := range c.Types {
		if t.Stream == stream {
			return t.Service
		}
	}
	return ""
}

// OwnedStreams lists, sorted, the streams of c that hold an event type
// service publishes: the streams service creates and updates (its NATS
// identity may not touch the others, natsauth).
func (c Catalogue) OwnedStreams(service string) []string {
	var out []string
	for _, t := range c.Types {
		if t.Service == service && !slices.Contains(out, t.Stream) {
			out = append(out, t.Stream)
		}
	}
	slices.Sort(out)
	return out
}

// EnsureServiceStreams is what a service process ensures at start: the
// streams it owns ([Catalogue.OwnedStreams]) are created or updated, and,
// when it consumes any event (and so may park one), the dead-letter stream
// is created if it is missing and otherwise left as it is.
func EnsureServiceStreams(ctx context.Context, js jetstream.JetStream, c Catalogue, service string, replicas int) error {
	var createOnly []string
	if len(c.Consumes(service)) > 0 {
		createOnly = []string{StreamDeadLetter}
	}
	return EnsureStreamsOf(ctx, js, c, replicas, c.OwnedStreams(service), createOnly)
}

// EnsureStreamsOf creates or updates the streams named in names (streams
// of c or [StreamDeadLetter]) with replicas copies each, as
// [EnsureStreamsReplicas] does, and creates each of createOnly that is
// missing, leaving an existing one as it is.
func EnsureStreamsOf(ctx context.Context, js jetstream.JetStream, c Catalogue, replicas int, names, createOnly []string) error {
	_, err := ApplyStreamsOf(ctx, js, c, replicas, names, createOnly)
	return err
}

// ApplyStreamsOf is [EnsureStreamsOf], saying what it did to each stream
// of names and to each of createOnly it created (one another process made
// meanwhile is left out).
func ApplyStreamsOf(ctx context.Context, js jetstream.JetStream, c Catalogue, replicas int, names, createOnly []string) ([]StreamChange, error) {
	subjects := c.StreamSubjects()
	subjects[StreamDeadLetter] = []string{DeadLetterSubjectPrefix + ".>"}
	dupWindow, _ := StreamDuplicateWindow() // a process refuses a bad value at start (process.EnvFromOS)
	var changes []StreamChange
	for _, name := range append(slices.Clone(names), createOnly...) {
		subs, ok := subjects[name]
		if !ok {
			return changes, fmt.Errorf("stream %s: %w: not a stream of the catalogue", name, ErrInvalidCatalogue)
		}
		n := max(replicas, 1)
		var before *jetstream.StreamConfig
		if s, err := js.Stream(ctx, name); err == nil {
			if slices.Contains(createOnly, name) && !slices.Contains(names, name) {
				continue
			}
			before = &s.CachedInfo().Config
			n = max(n, before.Replicas)
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return changes, fmt.Errorf("stream %s: %w", name, err)
		}
		cfg := jetstream.StreamConfig{
			Name:       name,
			Subjects:   subs,
			Retention:  jetstream.LimitsPolicy,
			Storage:    jetstream.FileStorage,
			Duplicates: dupWindow,
			MaxAge:     MaxAge,
			Discard:    jetstream.DiscardOld,
			Replicas:   n,
		}
		var (
			st  jetstream.Stream
			err error
		)
		if slices.Contains(names, name) {
			st, err = js.CreateOrUpdateStream(ctx, cfg)
		} else if st, err = js.CreateStream(ctx, cfg); errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			continue // made meanwhile, by another process
		}
		if err != nil {
			return changes, fmt.Errorf("stream %s: %w", name, err)
		}
		ch := StreamChange{Stream: name, Action: StreamCreated, Subjects: subs, Replicas: n, Owner: c.StreamOwner(name)}
		if before != nil {
			ch.Action = StreamUpdated
			if after := st.CachedInfo().Config; reflect.DeepEqual(*before, after) {
				ch.Action = StreamUnchanged
			}
		}
		changes = append(changes, ch)
	}
	return changes, nil
}
