package reconciler

import "errors"

var (
	// ErrInvalidConfig is wrapped by the error [New] and [Replay] return
	// for a bad Config.
	ErrInvalidConfig = errors.New("reconciler: invalid config")
	// ErrTripNotFound is returned by [Reconciler.View] for a trip the
	// projection has never seen an event of.
	ErrTripNotFound = errors.New("reconciler: trip not found")
	// ErrUnknownProjection is returned by [ReplayProjection] for a name
	// other than "reconciler".
	ErrUnknownProjection = errors.New("reconciler: unknown projection")
)
