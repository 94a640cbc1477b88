package outbox

import (
	"context"
	"errors"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cause names why a publish of an outbox row failed. It is stored with the
// row (outbox.last_cause), labels the relay's metrics and is shown by
// `tripsaga outbox list` and on /readyz.
type Cause string

// Causes. Only [CauseRefused] counts towards quarantine; every other cause
// is an outage: the server's state, not the event, is at fault, so the row
// is retried with backoff (at most RelayConfig.BackoffMax, well inside the
// duplicate window) for as long as it lasts and is published when it ends.
const (
	// CauseRefused: the server refused the event itself: too large, headers
	// too large or malformed, a per-message header it rejects.
	CauseRefused Cause = "refused"
	// CauseStorage: the server or account has no storage or memory left
	// (JetStream error codes 10023, 10047, 10028, 10002) or failed to
	// store (10077).
	CauseStorage Cause = "storage"
	// CauseLimits: a stream limit with DiscardNew refused new messages
	// (10053): maximum messages, bytes or messages per subject reached.
	CauseLimits Cause = "limits"
	// CauseNoStream: no stream holds the subject (no responders, 10059), e.g.
	// a stream deleted or re-subjected at runtime.
	CauseNoStream Cause = "no_stream"
	// CauseNoLeader: a clustered stream has no leader or quorum (10008,
	// 10009, 10074).
	CauseNoLeader Cause = "no_leader"
	// CauseTimeout: no PubAck in time; the event may have been stored, and
	// the duplicate window drops the re-publish.
	CauseTimeout Cause = "timeout"
	// CauseDisconnected: no connection to NATS.
	CauseDisconnected Cause = "disconnected"
	// CauseServer: any other error from the server that is not known to be
	// about the event itself.
	CauseServer Cause = "server"
)

// Outage reports whether c is an outage (never counted towards quarantine).
func (c Cause) Outage() bool { return c != CauseRefused }

// JetStream error codes (nats-server's server/errors.json) that refuse the
// event itself. Any other API error is taken for the server's state.
var refusedCodes = map[jetstream.ErrorCode]bool{ //nolint:gochecknoglobals // constant table
	10054: true, // JSStreamMessageExceedsMaximumErr: message size exceeds maximum allowed
	10097: true, // JSStreamHeaderExceedsMaximumErr: header size exceeds maximum allowed of 64k
	10070: true, // JSStreamWrongLastMsgIDErrF: wrong last msg ID (an Nats-Expected-* header)
	10071: true, // JSStreamWrongLastSequenceErrF
	10164: true, // JSStreamWrongLastSequenceConstantErr
	10165: true, // JSMessageTTLInvalidErr: invalid per-message TTL header
	10166: true, // JSMessageTTLDisabledErr: a TTL header on a stream without TTLs
	10168: true, // JSMessageIncrDisabledErr
	10169: true, // JSMessageIncrMissingErr
	10170: true, // JSMessageIncrPayloadErr
	10171: true, // JSMessageIncrInvalidErr
	10172: true, // JSMessageCounterBrokenErr
	10175: true, // JSAtomicPublishMissingSeqErr
	10177: true, // JSAtomicPublishUnsupportedHeaderBatchErr
	10188: true, // JSMessageSchedulesDisabledErr
	10189: true, // JSMessageSchedulesPatternInvalidErr
	10190: true, // JSMessageSchedulesTargetInvalidErr
	10191: true, // JSMessageSchedulesTTLInvalidErr
}

var storageCodes = map[jetstream.ErrorCode]bool{ //nolint:gochecknoglobals // constant table
	10023: true, // JSInsufficientResourcesErr: insufficient resources
	10047: true, // JSStorageResourcesExceededErr: insufficient storage resources available
	10028: true, // JSMemoryResourcesExceededErr
	10002: true, // JSAccountResourcesExceededErr: resource limits exceeded for account
	10077: true, // JSStreamStoreFailedF: the store failed (disk full, I/O)
}

// errBadRow marks a row the relay cannot even turn into a message (its
// stored headers are not JSON): a refusal, quarantined in the end.
var errBadRow = errors.New("outbox: row cannot be published")

// Classify returns the [Cause] of a publish error err: a JetStream API
// error by its code (nats-server's errors.json), a client error by its
// sentinel (nats.go). Unknown errors are outages ([CauseServer]), so a good
// event is never quarantined for a reason nobody recognised.
func Classify(err error) Cause {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch {
		case refusedCodes[api.ErrorCode]:
			return CauseRefused
		case storageCodes[api.ErrorCode]:
			return CauseStorage
		case api.ErrorCode == 10053:
			return CauseLimits
		case api.ErrorCode == jetstream.JSErrCodeStreamNotFound:
			return CauseNoStream
		case api.ErrorCode == 10008 || api.ErrorCode == 10009 || api.ErrorCode == 10074 || api.Code == 503:
			return CauseNoLeader
		}
		return CauseServer
	}
	switch {
	case errors.Is(err, errBadRow), errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject),
		errors.Is(err, nats.ErrBadHeaderMsg), errors.Is(err, nats.ErrInvalidMsg):
		return CauseRefused
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return CauseNoStream
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, errNoPubAck):
		return CauseTimeout
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrConnectionDraining), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		return CauseDisconnected
	}
	return CauseServer
}
