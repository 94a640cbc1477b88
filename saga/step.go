// Package saga is the step machinery every service of the choreography
// shares: the step log, Idempotency-Keys derived from trip and step,
// unknown-outcome resolution, compensation retries with incidents, and the
// recovery pass. A service declares a [Spec] (its company, its events) and
// calls [Runner.Request] from its trigger handler and [Runner.RequestUndo]
// from its compensation handler, both inside the inbox transaction; the
// runner does the rest from the step log, so a crash anywhere loses nothing.
//
// The rules, in the order the runner applies them:
//
//   - Write down before you call: a row is "started" (committed) before the
//     company is called; what came back is written after.
//   - Every call carries the Idempotency-Key "<trip>:<step>"; undo goes by
//     the same key.
//   - Business rejections (409, 402, 422) are final, never retried.
//   - Unknown is not failed: a timeout, 5xx or lost connection is asked
//     again by the same key with backoff until the step's deadline; at the
//     deadline the step is undone by key (the company answers "none" if it
//     never happened) and published as failed.
//   - A company that misbehaves (a body that does not parse, an unknown
//     status word, an answer about another key or amount, 401/403 to a
//     call) is unknown too, never success: asked again by the same key.
//     An answer about another key or amount, and 401/403, raise an
//     incident at once, since asking again will not fix them.
//   - Compensations are retried until they succeed (generous backoff); after
//     IncidentAfter attempts an incident is raised, and retries go on.
//   - An undo that arrives before its step voids it (the step never runs).
//   - After an undo of an uncertain step, the company is asked again later
//     (VerifyAfter) in case it committed late, and undone again if so.
package saga

import (
	"context"
	"time"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
)

// Status is a step log row's status.
type Status string

// Step statuses. Pending, Started, Unknown and Compensating are unfinished:
// the recovery pass picks them up.
const (
	Pending      Status = "pending"
	Started      Status = "started"
	Unknown      Status = "unknown"
	Done         Status = "done"
	Rejected     Status = "rejected"
	Compensating Status = "compensating"
	Compensated  Status = "compensated" // undone after a compensation request
	Failed       Status = "failed"      // unknown at the deadline, undone by key
	Voided       Status = "voided"      // the undo came before the step
)

// Undo causes.
const (
	CauseCompensation = "compensation" // a later step failed
	CauseDeadline     = "deadline"     // the outcome stayed unknown
	CauseLateCommit   = "late_commit"  // the company committed after we undid
)

// Incident kinds.
const (
	IncidentCompensationStuck = "compensation_stuck"
	IncidentForwardStuck      = "forward_stuck"
	IncidentForwardRefused    = "forward_refused"
	// IncidentCompensationRefused: the company refused the undo for good
	// (a 4xx such as 422 "card closed"); raised at the first refusal, and
	// the undo is retried at the longest backoff until a person acts.
	IncidentCompensationRefused = "compensation_refused"
	// IncidentForwardAnswerMismatch: the company answered the step's call
	// (or a status by its key) naming another Idempotency-Key, or another
	// amount or currency than requested ([provider.MismatchError]). Never
	// taken as success: the step stays unknown and is asked again by the
	// same key, but asking again will not fix a company that answers
	// wrongly, so it is raised at the first such answer. Resolved when the
	// step settles on a good answer.
	IncidentForwardAnswerMismatch = "forward_answer_mismatch"
	// IncidentCompensationAnswerMismatch: the same for an undo's answer;
	// the undo is retried by key and the row stays compensating.
	IncidentCompensationAnswerMismatch = "compensation_answer_mismatch"
	// IncidentCompanyCredentials: the company answered the step's call 401
	// or 403 ([provider.CredentialsError]): not a business rejection, and
	// nothing happened; the step stays unknown and is asked again by the
	// same key while a person renews the credentials. Raised at the first
	// one. (An undo answered 401/403 raises compensation_refused.)
	IncidentCompanyCredentials = "company_credentials"
)

// Company is the port to the outside company of one step. provider.Client
// implements it. Every error that leaves the outcome unknown wraps
// [provider.ErrUnknownOutcome]; a [*provider.MismatchError] or a
// [*provider.CredentialsError] among them raises an incident.
type Company interface {
	Create(ctx context.Context, key string, body any) (provider.Result, error)
	Undo(ctx context.Context, key string) (provider.Result, error)
	Status(ctx context.Context, key string) (provider.Result, error)
}

// StatusChecker is an optional ability of a [Company]: a status by key
// checked against the request sent under it (provider.Client's StatusFor
// checks the amount and currency a charge answer echoes). The runner uses
// it, when the Company has it, to learn an unknown forward outcome.
type StatusChecker interface {
	StatusFor(ctx context.Context, key string, body any) (provider.Result, error)
}

// Spec declares one step of one service.
type Spec struct {
	// Name of the step ("reserve"); the Idempotency-Key is
	// "<trip>:<KeyName>".
	Name string
	// KeyName defaults to Name (a company's contract may spell the key
	// otherwise: the trip's card step is keyed "charge", providers.md).
	KeyName string
	// Service is the owning service; events have source /tripsaga/<Service>.
	Service string
	// Class: compensable, pivot or forward-only. Forward-only steps are
	// never undone: they are retried until they succeed.
	Class events.StepClass
	// Company called by the step.
	Company Company
	// ActiveStatus is the company's status word of a resource in force
	// ("held"), used to verify after an undo.
	ActiveStatus string
	// RejectedStatus is the company's status word of a record of a
	// business rejection ("declined"; provider.Client.RejectedStatus),
	// empty when it keeps none: asked by key after an unknown outcome,
	// such a record is a rejection, given RejectedReason, never retried.
	RejectedStatus, RejectedReason string
	// Event types published: when done, rejected, failed (unknown at the
	// deadline, undone by key) and undone by a compensation. Empty means
	// publish nothing for that outcome.
	OnDone, OnRejected, OnFailed, OnUndone string
	// OnStuck is published once when the undo raises its incident
	// (compensation_stuck or compensation_refused) and goes on retrying:
	// the step before is undone on it (events.Compensation.Stuck). Empty:
	// nothing is published ([NewService] takes it from the catalogue).
	OnStuck string
}

// Timing of a runner. Zero fields take the defaults.
type Timing struct {
	// CallTimeout is each company call's deadline. Defaults to 2 s.
	CallTimeout time.Duration
	// StepDeadline is how long after the step was requested an unknown
	// outcome is still asked again; past it the step is undone by key.
	// Defaults to 8 s.
	StepDeadline time.Duration
	// RetryBackoffMin/Max bound the backoff between asks of an unknown
	// outcome (doubling). Default 200 ms and 2 s.
	RetryBackoffMin, RetryBackoffMax time.Duration
	// UndoBackoffMin/Max bound the backoff between undo attempts
	// (doubling). Default 250 ms and 5 s.
	UndoBackoffMin, UndoBackoffMax time.Duration
	// IncidentAfter is the number of failed undo (or forward-only) attempts
	// after which an incident is raised. Defaults to 5.
	IncidentAfter int
	// VerifyAfter is how long after undoing an uncertain step the company
	// is first asked again, in case it committed late. Defaults to 15 s.
	VerifyAfter time.Duration
	// VerifyHorizon is how long after the undo the company keeps being
	// asked (the gap growing with the time passed, at most 10 min): the
	// longest a company is assumed to commit late. Past it the reconciler's
	// sweep still finds a late commit as a "half" trip. Defaults to 1 h.
	VerifyHorizon time.Duration
	// PollInterval is how often the runner looks for due rows when nothing
	// woke it. Defaults to 500 ms.
	PollInterval time.Duration
}

// Defaults of [Timing].
const (
	CallTimeoutDefault     = 2 * time.Second
	StepDeadlineDefault    = 8 * time.Second
	RetryBackoffMinDefault = 200 * time.Millisecond
	RetryBackoffMaxDefault = 2 * time.Second
	UndoBackoffMinDefault  = 250 * time.Millisecond
	UndoBackoffMaxDefault  = 5 * time.Second
	IncidentAfterDefault   = 5
	VerifyAfterDefault     = 15 * time.Second
	VerifyHorizonDefault   = time.Hour
	PollIntervalDefault    = 500 * time.Millisecond
)

func (t *Timing) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&t.CallTimeout, CallTimeoutDefault)
	def(&t.StepDeadline, StepDeadlineDefault)
	def(&t.RetryBackoffMin, RetryBackoffMinDefault)
	def(&t.RetryBackoffMax, RetryBackoffMaxDefault)
	def(&t.UndoBackoffMin, UndoBackoffMinDefault)
	def(&t.UndoBackoffMax, UndoBackoffMaxDefault)
	def(&t.VerifyAfter, VerifyAfterDefault)
	def(&t.VerifyHorizon, VerifyHorizonDefault)
	def(&t.PollInterval, PollIntervalDefault)
	if t.IncidentAfter == 0 {
		t.IncidentAfter = IncidentAfterDefault
	}
}

func backoff(attempt int32, min, max time.Duration) time.Duration {
	d := min
	for i := int32(1); i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}
