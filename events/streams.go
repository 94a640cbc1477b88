package events

import (
	"context"
	"fmt"
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

// EnsureStreams creates or updates the event streams of c and the
// dead-letter stream.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, c Catalogue) error {
	subjects := c.StreamSubjects()
	subjects[StreamDeadLetter] = []string{DeadLetterSubjectPrefix + ".>"}
	for name, subs := range subjects {
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name:       name,
			Subjects:   subs,
			Retention:  jetstream.LimitsPolicy,
			Storage:    jetstream.FileStorage,
			Duplicates: DuplicateWindow,
			MaxAge:     MaxAge,
			Discard:    jetstream.DiscardOld,
		})
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
	}
	return nil
}
