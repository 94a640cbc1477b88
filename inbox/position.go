package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	dbsqlc "github.com/tripsaga/tripsaga/inbox/internal/dbsqlc"
)

// streamRow is what inbox_position records of the consumer's stream.
type streamRow = dbsqlc.InboxStreamLockRow

// readStream reads the stream's info, with its creation time and first
// and last sequences. An error wraps jetstream.ErrStreamNotFound when the
// stream does not exist.
func (in *Inbox) readStream(ctx context.Context) (*jetstream.StreamInfo, error) {
	s, err := in.cfg.JetStream.Stream(ctx, in.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", in.cfg.Stream, err)
	}
	return s.CachedInfo(), nil
}

// judge compares the stream st with what row records of the stream the
// position counts on, and with what this process saw of it: it returns
// the inbox's position on st (the ack floor; 0 when unknown or when st is
// another stream) and, when st is another stream, why.
//
// Another stream: one whose creation time differs from the recorded one
// (deleted and made again: JetStream StreamInfo.Created is set when a
// stream is created, the same on every replica of a clustered stream, and
// kept by a server restart and by a restore), or whose last sequence is
// below the last one seen on it (restored from an older store: sequences
// never go back on one stream, and a purge keeps them), or, for a row
// written before the creation time was recorded, below the position.
// Neither a purge nor messages aged out by the stream's limits is a new
// stream: the sequences go on and the position stays true.
func (in *Inbox) judge(st *jetstream.StreamInfo, row streamRow) (pos uint64, why string) {
	created := st.Created.Truncate(time.Microsecond)
	pos, last := uint64(max(row.AckFloor, 0)), uint64(max(row.LastSeq, 0))
	if in.streamCreated.Load() == created.UnixMicro() && (row.StreamCreated == nil || row.StreamCreated.Equal(created)) {
		// What this process saw counts only on the stream it saw it on.
		pos, last = max(pos, in.floor.Load()), max(last, in.lastSeq.Load())
	}
	switch {
	case row.StreamCreated != nil && !row.StreamCreated.Equal(created):
		return 0, fmt.Sprintf("the stream was created %s; the inbox's position %d counts on the stream created %s (deleted and made again?)",
			created.UTC().Format(time.RFC3339Nano), pos, row.StreamCreated.UTC().Format(time.RFC3339Nano))
	case st.State.LastSeq < last:
		return 0, fmt.Sprintf("the stream's last sequence %d is below %d, the last the inbox saw on it (restored from an older store?)", st.State.LastSeq, last)
	case st.State.LastSeq < pos:
		return 0, fmt.Sprintf("the stream's last sequence %d is below the inbox's position %d (restored or recreated?)", st.State.LastSeq, pos)
	}
	return pos, ""
}

// checkStream reads the stream and the consumer's inbox_position row,
// locked in tx, judges whether the stream is the one the position counts
// on (see [Inbox.judge]), and records the stream in the row: its creation
// time and first and last sequences, and, when it is another stream, a
// position of 0, so that the consumer reads it from its first message (the
// inbox table drops the events handled already); ensure logs that at error
// level and counts it (tripsaga_inbox_consumer_lost_total, reason
// stream_replaced) once tx commits. It returns the position on the stream
// as it is, the stream's info, and why it is another stream ("" if not).
func (in *Inbox) checkStream(ctx context.Context, tx pgx.Tx) (uint64, *jetstream.StreamInfo, string, error) {
	st, err := in.readStream(ctx)
	if err != nil {
		return 0, nil, "", err
	}
	key := dbsqlc.InboxPositionEnsureParams{Consumer: in.cfg.Name, Stream: in.cfg.Stream}
	if err := queries.InboxPositionEnsure(ctx, tx, key); err != nil {
		return 0, nil, "", fmt.Errorf("inbox position: %w", err)
	}
	row, err := queries.InboxStreamLock(ctx, tx, dbsqlc.InboxStreamLockParams(key))
	if err != nil {
		return 0, nil, "", fmt.Errorf("inbox position: %w", err)
	}
	pos, why := in.judge(st, row)
	if why == "" && pos > 0 && st.State.FirstSeq > pos+1 && uint64(max(row.FirstSeq, 0)) != st.State.FirstSeq {
		// Purged, or aged out by the stream's limits, before this
		// consumer read them: nothing of it can be read again.
		in.cfg.Logger.With("consumer", in.cfg.Name, "stream", in.cfg.Stream).Warn("inbox: the stream's first message is past the inbox's position: the messages between were removed (purged, or aged out) before this consumer read them",
			"position", pos, "first_seq", st.State.FirstSeq)
	}
	created := st.Created.Truncate(time.Microsecond)
	last := st.State.LastSeq
	if why == "" {
		last = max(last, uint64(max(row.LastSeq, 0)))
	}
	err = queries.InboxStreamRecord(ctx, tx, dbsqlc.InboxStreamRecordParams{
		Consumer: in.cfg.Name, Stream: in.cfg.Stream, AckFloor: int64(pos), StreamCreated: &created,
		FirstSeq: int64(st.State.FirstSeq), LastSeq: int64(last),
	})
	if err != nil {
		return 0, nil, "", fmt.Errorf("inbox position: %w", err)
	}
	return pos, st, why, nil
}

// StartSeq is the stream sequence a missing durable consumer would be
// recreated from now: one past the inbox's position, its ack floor as last
// seen by this process or stored in inbox_position. Events are acked out
// of order by several workers and batches, so the last handled sequence
// (the inbox table's highest stream_seq) is not safe; the ack floor is,
// since every event at or below it was acked, and the inbox acks only
// after its transaction committed or the event was parked. Events after it
// that were handled already come again and are dropped as duplicates by
// the inbox table. It returns 0 (deliver all) when no position is known,
// or when the stream is not the one the position counts on (see
// [Inbox.judge]: deleted and made again, restored from an older store):
// when unsure, start earlier. It only reads; ensure decides and records.
func (in *Inbox) StartSeq(ctx context.Context) (uint64, error) {
	st, err := in.readStream(ctx)
	if err != nil {
		return 0, err
	}
	got, err := queries.InboxStreamGet(ctx, in.cfg.Pool, dbsqlc.InboxStreamGetParams{Consumer: in.cfg.Name, Stream: in.cfg.Stream})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("inbox position: %w", err)
	}
	pos, why := in.judge(st, streamRow(got))
	if why != "" || pos == 0 {
		return 0, nil
	}
	return pos + 1, nil
}
