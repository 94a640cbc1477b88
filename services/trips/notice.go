package trips

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/services/trips/internal/dbsqlc"
)

// The traveler's mails besides the final one (confirmed, canceled,
// canceled by the traveler): each is a forward-only step of its own, with
// its own step log row and Idempotency-Key, so it is sent once, never
// twice and never lost, under the same kills as every step.
const (
	// NoticeStep is the step of the delay notice: a trip still canceling
	// [Config.NoticeAfter] after it began canceling (on the database's
	// clock) is told that the cancellation is under way and which undo is
	// still open. One per trip: key "<trip>:mail:delayed".
	NoticeStep = "notice_mail"
	// NoticeKeyName is the notice's key name: key "<trip>:mail:delayed".
	NoticeKeyName = "mail:delayed"
	// CorrectionStep is the step of the correction mail: a trip the
	// traveler was told was confirmed that an operator then repaired (an
	// undo_leak or a settle naming one of its step services). One per
	// trip: key "<trip>:mail:correction".
	CorrectionStep = "correction_mail"
	// CorrectionKeyName is the correction's key name.
	CorrectionKeyName = "mail:correction"
)

// IsFinalMailKey reports whether the mail relay's key names a trip's
// final mail (its confirmation, its cancellation, its cancellation by the
// traveler) and not a delay notice or a correction: audits count "one mail
// per trip" over the final mails, and the others separately (see
// [MailKind]).
func IsFinalMailKey(key string) bool { return MailKind(key) == "final" }

// MailKind names the kind of mail a mail relay key is: "notice" (the
// delay notice, "<trip>:mail:delayed"), "correction"
// ("<trip>:mail:correction"), else "final".
func MailKind(key string) string {
	switch {
	case strings.HasSuffix(key, ":"+NoticeKeyName):
		return "notice"
	case strings.HasSuffix(key, ":"+CorrectionKeyName):
		return "correction"
	}
	return "final"
}

// DefaultNoticeAfter is how long a trip stays canceling before its
// traveler gets the delay notice when CANCELING_NOTICE_AFTER_MS is unset.
const DefaultNoticeAfter = 10 * time.Minute

// NoticeAfterVar names the variable of [Config.NoticeAfter], in ms.
const NoticeAfterVar = "CANCELING_NOTICE_AFTER_MS"

// NoticeAfterFromEnv reads CANCELING_NOTICE_AFTER_MS: a positive integer
// of milliseconds; unset, [DefaultNoticeAfter]. Anything else is an error
// naming the variable.
func NoticeAfterFromEnv() (time.Duration, error) {
	v := os.Getenv(NoticeAfterVar)
	if v == "" {
		return DefaultNoticeAfter, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n > int64(365*24*time.Hour/time.Millisecond) {
		return 0, fmt.Errorf("%s=%q: want a positive integer of milliseconds, at most a year's", NoticeAfterVar, v)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// noticeEvery is how often the notice pass looks: a tenth of the limit,
// between 100 ms and 5 s, so a notice goes out at most that late.
func noticeEvery(after time.Duration) time.Duration {
	return min(max(after/10, 100*time.Millisecond), 5*time.Second)
}

// noticeBatch is the most trips one notice pass records.
const noticeBatch = 100

// runNotices runs the notice pass every noticeEvery until ctx ends. A
// pass that fails is logged and tried again at the next tick.
func (s *Service) runNotices(ctx context.Context) error {
	tick := time.NewTicker(noticeEvery(s.noticeAfter))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for {
			n, err := s.NoticePass(ctx)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("trips: delay notice pass failed; trying again", "err", err)
				}
				break
			}
			if n < noticeBatch {
				break
			}
		}
	}
}

// NoticePass records the delay notice of every trip still canceling
// [Config.NoticeAfter] after it began (the database's clock decides),
// up to 100 at a time, in one transaction, and returns how many it
// recorded. The notice step's row is written in this transaction and its
// call launched after the commit; the step log's primary key (trip,
// step) keeps it to one per trip whichever replica's pass finds it, and
// the runner's lease to one call of its key in flight. A trip that settles
// first gets no notice: the pass reads it under its row lock.
func (s *Service) NoticePass(ctx context.Context) (int, error) {
	n := 0
	err := s.uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := queries.TripNoticeDue(ctx, tx, dbsqlc.TripNoticeDueParams{AfterMs: float64(s.noticeAfter.Milliseconds()), Max: noticeBatch})
		if err != nil {
			return fmt.Errorf("trips: trips due a delay notice: %w", err)
		}
		for _, row := range rows {
			var req events.TripRequest
			if err := json.Unmarshal(row.Request, &req); err != nil || req.Traveler.Email == "" {
				s.log.Error("trips: a canceling trip without a traveler's email gets no delay notice", "trip_id", row.TripID, "err", err)
				continue
			}
			subject, text := noticeMail(row, req)
			added, err := s.notice.Request(ctx, tx, saga.Request{
				TripID: row.TripID, KeyName: NoticeKeyName,
				Body: map[string]string{"to": oneLine(req.Traveler.Email), "subject": subject, "text": text, "trip_id": row.TripID},
			})
			if err != nil {
				return err
			}
			if added {
				n++
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if n > 0 {
		s.log.Info("trips: delay notices recorded for trips still canceling", "trips", n, "after", s.noticeAfter)
	}
	return n, nil
}

// undoWords says, for the traveler, what each step's undo is.
var undoWords = map[string]string{ //nolint:gochecknoglobals // read-only
	"hotel":     "the release of your room",
	"payment":   "the refund of your card",
	"car":       "the cancellation of your car",
	"insurance": "the cancellation of your travel insurance",
}

// noticeMail is the delay notice's subject and text: the trip is being
// canceled, why, which undo is still open ([OpenUndosOf]), and that
// nothing more is needed from the traveler.
func noticeMail(row dbsqlc.Trip, req events.TripRequest) (subject, text string) {
	trip, name := oneLine(row.TripID), oneLine(req.Traveler.Name)
	why := ""
	if row.Reason != nil && *row.Reason != "" {
		why = " (" + oneLine(*row.Reason) + ")"
	}
	var open []string
	for _, step := range OpenUndosOf(row.Version, row.Seen) {
		if w, ok := undoWords[step]; ok {
			open = append(open, w)
		} else {
			open = append(open, "the undo of "+step)
		}
	}
	still := "undoing what was booked is still under way"
	if len(open) > 0 {
		still = strings.Join(open, " and ") + " is still under way"
		if len(open) > 1 {
			still = strings.Join(open, " and ") + " are still under way"
		}
	}
	subject = "Your trip " + trip + " is being canceled"
	text = "Hello " + name + ",\n\nwe could not book your trip" + why + ", so we are canceling it. " +
		strings.ToUpper(still[:1]) + still[1:] + ": it is taking longer than it should, and we are on it. " +
		"Nothing more is needed from you: we will write again once the cancellation is done.\n"
	return subject, text
}
