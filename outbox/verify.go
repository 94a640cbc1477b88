package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/outbox/internal/dbsqlc"
)

// Verify defaults (RelayConfig).
const (
	RelayVerifyIntervalDefault = 10 * time.Second
	RelayVerifyBatchDefault    = 1000
	RelayVerifyAgainDefault    = time.Minute
)

// CauseLost is the cause of a row whose event its stream no longer holds
// ([Verify]): it waits to be published again, never quarantined.
const CauseLost Cause = "lost"

// lostMargin is added to the duplicate window before a lost row is due:
// the server forgets a Nats-Msg-Id on a timer, a little after the window.
// A re-publish the server still answers "duplicate" (its sequence holds
// nothing) is found lost again by the next pass, and waits once more.
const lostMargin = time.Second

// verifyWorkers is how many reads by sequence one pass has in flight.
const verifyWorkers = 16

// VerifyOptions says what one [Verify] pass checks.
type VerifyOptions struct {
	// Since: only rows published since then (the relay passes now minus
	// RelayConfig.Retention: every row still kept). Zero: every row.
	Since time.Time
	// ReadBack is how many rows to read back by sequence, those never
	// read back first, then those read back longest ago; -1 reads back
	// every row. 0 does only the gap check.
	ReadBack int
	// Again: a row read back less than this long ago is not read back
	// again. Zero reads back again whatever was read back before now.
	Again time.Duration
	// Logger receives one error line per lost event. Defaults to discard.
	Logger *slog.Logger
	// OnLost, when set, is called for each lost event put back in line.
	OnLost func(Lost)
	// Spread, when positive, paces the routine read-back (the ReadBack
	// rows, not the gap check's suspects, which are read at once) over
	// about this long, in chunks of verifyChunk rows: the k-th chunk of m
	// is read no sooner than k × Spread ÷ m after the first. The relay
	// spreads each pass over half its VerifyInterval, so that a pass is a
	// few short bursts of STREAM.MSG.GET requests instead of one of up to
	// VerifyBatch, which every relay of a host used to send in the same
	// second (BENCHMARKS.md, "One trip, hop by hop"); row by row it would
	// wake the relay and the server for every read. Zero reads them all at
	// once, verifyWorkers at a time (`tripsaga outbox verify`).
	Spread time.Duration
}

// verifyChunk is how many rows a paced read-back reads at once.
const verifyChunk = 100

// paceAt is when the i-th row of toRead may be read back: at once for the
// first suspects rows (the gap check's) and with spread zero; otherwise
// the routine rows' chunks of verifyChunk evenly over spread from start.
func paceAt(start time.Time, i, suspects, n int, spread time.Duration) time.Time {
	chunks := (n - suspects + verifyChunk - 1) / verifyChunk
	if spread <= 0 || i < suspects || chunks <= 1 {
		return start
	}
	return start.Add(spread * time.Duration((i-suspects)/verifyChunk) / time.Duration(chunks))
}

// Lost is a published event its stream no longer held, put back in line
// to be published again with the same Nats-Msg-Id.
type Lost struct {
	EventID string `json:"event_id"`
	Stream  string `json:"stream"`
	// Seq is where its PubAck said it was stored.
	Seq uint64 `json:"seq"`
	// Why: "not found" (deleted, purged, aged out, never synced), "another
	// event" (the sequence holds another message: a restored or rebuilt
	// stream), "no stream".
	Why string `json:"why"`
	// Due is when the relay publishes it again: not before the stream's
	// duplicate window since its first store has passed, or the server,
	// which may still remember its Nats-Msg-Id, would answer
	// "duplicate" and store nothing.
	Due time.Time `json:"due"`
}

// VerifyReport is what one [Verify] pass found.
type VerifyReport struct {
	// Streams is how many streams the gap check read the state of.
	Streams int `json:"streams"`
	// Suspects is how many rows the gap check found outside their
	// stream's sequences (each is then read back).
	Suspects int `json:"suspects"`
	// ReadBack is how many rows were read back by sequence.
	ReadBack int `json:"read_back"`
	// Lost are the events put back in line.
	Lost []Lost `json:"lost"`
}

// verifyRow is an outbox row to confirm.
type verifyRow struct {
	id          int64
	eventID     string
	stream      string
	seq         int64
	publishedAt time.Time
}

// Verify confirms that the published events of the outbox db reaches are
// still in their streams, where their PubAcks said they were stored
// (stream and sequence, kept by the relay), and puts back in line every
// one that is not, to be published again with its event id as
// Nats-Msg-Id (consumers' inboxes drop a copy of what they handled).
//
// A pass has two parts. The gap check reads each stream's state (one
// STREAM.INFO request with the deleted sequences) and selects every row
// since opts.Since whose sequence is below the stream's first, above its
// last, or deleted: a purge, a message delete, a stream deleted, or a
// server that lost what it had not fsynced is found at once for every
// kept row. The read-back reads opts.ReadBack rows by sequence (STREAM.MSG.GET)
// and compares their Nats-Msg-Id: it finds a sequence that now holds
// another event (a stream restored from an older snapshot, or rebuilt, and
// written to since), which the gap check cannot see. Every suspect of the
// gap check is read back before it is called lost, so a row marked while
// the pass ran is not taken for lost.
//
// A lost row is due again once the stream's duplicate window (its
// configured Duplicates, events.DuplicateWindow when unknown) has passed
// since it was published: JetStream keeps a deleted or purged message's
// Nats-Msg-Id until then, and would answer a re-publish "duplicate"
// without storing it (nats-server 2.15: the dedup map is cleared only when
// a stream is loaded, not on a delete or a purge). Until it is published
// again it is listed by `tripsaga outbox list --waiting` with cause
// [CauseLost], and on /readyz ([Details]).
//
// Rows published before the relay kept sequences (stream_seq NULL) are
// not checked. Errors reading a stream or a message leave those rows
// unjudged (returned joined); nothing is called lost on an error.
func Verify(ctx context.Context, db dbsqlc.DBTX, js jetstream.JetStream, opts VerifyOptions) (VerifyReport, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	var rep VerifyReport
	var errs []error
	names, err := queries.OutboxStoredStreams(ctx, db)
	if err != nil {
		return rep, fmt.Errorf("outbox: verify: streams: %w", err)
	}
	type streamState struct {
		s       jetstream.Stream // nil: no such stream
		dupWin  time.Duration
		missing bool
	}
	streams := map[string]*streamState{}
	var suspects []verifyRow
	for _, name := range names {
		st := &streamState{dupWin: events.DuplicateWindow}
		streams[name] = st
		s, err := js.Stream(ctx, name)
		first, last, deleted := uint64(math.MaxInt64), uint64(0), []int64(nil)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			st.missing = true // every row of it is lost
		case err != nil:
			errs = append(errs, fmt.Errorf("stream %s: %w", name, err))
			continue
		default:
			info, err := s.Info(ctx, jetstream.WithDeletedDetails(true))
			if err != nil {
				errs = append(errs, fmt.Errorf("stream %s: info: %w", name, err))
				continue
			}
			st.s = s
			if info.Config.Duplicates > 0 {
				st.dupWin = info.Config.Duplicates
			}
			first, last = info.State.FirstSeq, info.State.LastSeq
			for _, d := range info.State.Deleted {
				deleted = append(deleted, int64(d))
			}
		}
		rep.Streams++
		rows, err := queries.OutboxOutsideStream(ctx, db, dbsqlc.OutboxOutsideStreamParams{
			Stream: new(name), Since: opts.Since, FirstSeq: int64(min(first, math.MaxInt64)), LastSeq: int64(min(last, math.MaxInt64)),
			Deleted: deleted, Max: 100000,
		})
		if err != nil {
			return rep, fmt.Errorf("outbox: verify: %s: %w", name, err)
		}
		for _, r := range rows {
			suspects = append(suspects, verifyRow{id: r.ID, eventID: r.EventID, stream: name, seq: r.StreamSeq, publishedAt: r.PublishedAt})
		}
	}
	rep.Suspects = len(suspects)
	toRead := suspects
	if opts.ReadBack != 0 {
		limit := int32(opts.ReadBack)
		if opts.ReadBack < 0 {
			limit = math.MaxInt32
		}
		rows, err := queries.OutboxToVerify(ctx, db, dbsqlc.OutboxToVerifyParams{
			Since: opts.Since, Before: time.Now().Add(-opts.Again), Max: limit,
		})
		if err != nil {
			return rep, fmt.Errorf("outbox: verify: read-back rows: %w", err)
		}
		for _, r := range rows {
			toRead = append(toRead, verifyRow{id: r.ID, eventID: r.EventID, stream: r.Stream, seq: r.StreamSeq, publishedAt: r.PublishedAt})
		}
		rep.ReadBack = len(rows)
	}
	// Streams the gap check did not meet (rows read back only).
	for _, r := range toRead {
		if _, ok := streams[r.stream]; ok {
			continue
		}
		st := &streamState{dupWin: events.DuplicateWindow}
		streams[r.stream] = st
		s, err := js.Stream(ctx, r.stream)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			st.missing = true
		case err != nil:
			errs = append(errs, fmt.Errorf("stream %s: %w", r.stream, err))
		default:
			st.s = s
			if d := s.CachedInfo().Config.Duplicates; d > 0 {
				st.dupWin = d
			}
		}
	}
	// Read back by sequence, verifyWorkers at a time.
	type verdict struct {
		row verifyRow
		why string // "" when found
		err error
	}
	verdicts := make([]verdict, len(toRead))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(verifyWorkers, len(toRead)) {
		wg.Go(func() {
			for i := range next {
				r := toRead[i]
				v := verdict{row: r}
				st := streams[r.stream]
				switch {
				case st.missing:
					v.why = "no stream"
				case st.s == nil:
					v.err = fmt.Errorf("stream %s unknown", r.stream)
				default:
					m, err := st.s.GetMsg(ctx, uint64(r.seq))
					switch {
					case errors.Is(err, jetstream.ErrMsgNotFound):
						v.why = "not found"
					case err != nil:
						v.err = fmt.Errorf("stream %s seq %d: %w", r.stream, r.seq, err)
					case m.Header.Get(natsMsgID) != r.eventID:
						v.why = "another event"
					}
				}
				verdicts[i] = v
			}
		})
	}
	start := time.Now()
	paced := true
	for i := range toRead {
		if at := paceAt(start, i, rep.Suspects, len(toRead), opts.Spread); paced && time.Until(at) > 0 {
			t := time.NewTimer(time.Until(at))
			select {
			case <-ctx.Done():
				paced = false // the rest at once: each read fails on ctx, unjudged
			case <-t.C:
			}
			t.Stop()
		}
		next <- i
	}
	close(next)
	wg.Wait()
	var verified, verifiedSeqs []int64
	for _, v := range verdicts {
		if v.err != nil {
			errs = append(errs, v.err)
			continue
		}
		if v.why == "" {
			verified = append(verified, v.row.id)
			verifiedSeqs = append(verifiedSeqs, v.row.seq)
			continue
		}
		st := streams[v.row.stream]
		due, err := queries.OutboxMarkLost(ctx, db, dbsqlc.OutboxMarkLostParams{
			ID: v.row.id, StreamSeq: pgtype.Int8{Int64: v.row.seq, Valid: true}, DuplicateWindowSeconds: st.dupWin.Seconds(), MarginSeconds: lostMargin.Seconds(),
			Why: new(fmt.Sprintf("stream %s lost it (%s at seq %d); published again after the duplicate window", v.row.stream, v.why, v.row.seq)),
		})
		if errors.Is(err, pgx.ErrNoRows) {
			continue // marked again meanwhile, or another verify was first
		}
		if err != nil {
			return rep, fmt.Errorf("outbox: verify: mark lost %s: %w", v.row.eventID, err)
		}
		l := Lost{EventID: v.row.eventID, Stream: v.row.stream, Seq: uint64(v.row.seq), Why: v.why, Due: due.UTC()}
		rep.Lost = append(rep.Lost, l)
		opts.Logger.Error("outbox verify: a published event is no longer in its stream; it is published again with the same Nats-Msg-Id (consumers' inboxes drop what they handled)",
			"event_id", l.EventID, "stream", l.Stream, "seq", l.Seq, "why", l.Why, "due", l.Due)
		if opts.OnLost != nil {
			opts.OnLost(l)
		}
	}
	if len(verified) > 0 {
		if err := queries.OutboxVerified(ctx, db, dbsqlc.OutboxVerifiedParams{Ids: verified, Seqs: verifiedSeqs}); err != nil {
			return rep, fmt.Errorf("outbox: verify: mark verified: %w", err)
		}
	}
	if len(rep.Lost) > 0 {
		if err := queries.OutboxNotify(ctx, db); err != nil {
			errs = append(errs, fmt.Errorf("notify: %w", err))
		}
	}
	if len(errs) > 0 {
		return rep, fmt.Errorf("outbox: verify: %w", errors.Join(errs...))
	}
	return rep, nil
}

// natsMsgID is the header JetStream deduplicates by (jetstream.MsgIDHeader).
const natsMsgID = jetstream.MsgIDHeader

// verifyLoop runs a [Verify] pass every VerifyInterval until ctx ends,
// over the rows still kept (Retention).
//
// The first pass comes after a random part of VerifyInterval, so the
// relays of services started together do not all verify in the same
// second, and each pass's read-back is spread over half the interval
// (VerifyOptions.Spread).
func (r *Relay) verifyLoop(ctx context.Context) {
	first := time.NewTimer(rand.N(r.cfg.VerifyInterval) + time.Millisecond) //nolint:gosec // a jitter, not a secret
	select {
	case <-ctx.Done():
		first.Stop()
		return
	case <-first.C:
	}
	t := time.NewTicker(r.cfg.VerifyInterval)
	defer t.Stop()
	for pass := 0; ; pass++ {
		if pass > 0 {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		rep, err := Verify(ctx, r.cfg.Pool, r.cfg.JetStream, VerifyOptions{
			Since: time.Now().Add(-r.cfg.Retention), ReadBack: r.cfg.VerifyBatch, Again: r.cfg.VerifyAgain,
			Logger: r.cfg.Logger, Spread: r.cfg.VerifyInterval / 2,
			OnLost: func(l Lost) { r.m.lost.WithLabelValues(l.Stream).Inc() },
		})
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("outbox verify: pass incomplete; the rows not judged are checked next pass", "err", err)
		}
		r.m.verified.Add(float64(rep.ReadBack + rep.Suspects))
	}
}
