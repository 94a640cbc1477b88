// Package natssync is the one place that sets how the JetStream file store
// of every NATS server tripsaga starts or configures reaches the disk: the
// servers embedded in `tripsaga up`, demo, chaos, bench and the tests
// ([Apply] on their server.Options), the cluster nodes of
// `tripsaga serve nats` (the same), and compose's nats-server.conf
// ([ConfBlock], written by natsauth.ServerConf).
//
// The policy is sync_interval: always (server.Options.SyncAlways): the
// server fsyncs each message before its PubAck. nats-server's default
// fsyncs a file stream every 2 minutes (NATS docs, "JetStream
// configuration", sync_interval); a power loss or an OS crash of its host
// inside that window loses messages whose PubAck was already sent
// (Jepsen, "NATS 2.12.1", December 2025), and the outbox has by then
// marked them published. A process killed with SIGKILL loses nothing
// either way: the written pages are in the OS's cache.
//
// The outbox's verify (outbox.Relay, `tripsaga outbox verify`) is the
// second line: it finds what a stream lost anyway (a snapshot restored, a
// message deleted, a stream purged) and publishes it again.
package natssync

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Policy is the sync policy in nats-server's configuration words.
const Policy = "always"

// DefaultInterval is nats-server's own sync interval when nothing sets one
// (server/opts.go defaultSyncInterval).
const DefaultInterval = 2 * time.Minute

// ConfBlock is the policy as a nats-server configuration block, for a
// configuration file (NATS docs, "JetStream configuration": sync_interval
// accepts a duration or "always"). A store folder given on the command line
// (-sd) is merged with it.
const ConfBlock = "# Every message is fsynced before its PubAck (internal/natssync): the\n" +
	"# default, an fsync every 2 minutes, loses acknowledged events when the\n" +
	"# host loses power or its OS crashes.\n" +
	"jetstream {\n  sync_interval: " + Policy + "\n}\n"

// Apply sets the policy on the options of an embedded server, before
// server.NewServer.
func Apply(o *server.Options) {
	o.SyncAlways = true
	if o.SyncInterval == 0 {
		o.SyncInterval = DefaultInterval
	}
}

// Setting is a server's sync setting as its /varz or /jsz reports it
// (server.JetStreamConfig's sync_interval and sync_always).
type Setting struct {
	Always   bool
	Interval time.Duration
}

// String names the setting in configuration words: "always" or the
// interval ("2m0s"; "2m0s (the default)" when zero, which the server
// reports when nothing set it).
func (s Setting) String() string {
	switch {
	case s.Always:
		return "always"
	case s.Interval == 0 || s.Interval == DefaultInterval:
		return DefaultInterval.String() + " (the default)"
	}
	return s.Interval.String()
}

// Risk says in one sentence what the setting risks, and whether it is the
// policy.
func (s Setting) Risk() string {
	if s.Always {
		return "every message is on disk before its PubAck: a power loss or OS crash of the NATS host loses no acknowledged event"
	}
	iv := s.Interval
	if iv == 0 {
		iv = DefaultInterval
	}
	return fmt.Sprintf("a power loss or OS crash of the NATS host loses the acknowledged events of the last %s; the outbox's verify publishes again those its rows still hold (set sync_interval: always, internal/natssync)", iv)
}
