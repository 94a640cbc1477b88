package saga

import "errors"

var (
	// ErrInvalidConfig is wrapped by [New] for a bad Config.
	ErrInvalidConfig = errors.New("saga: invalid config")
	// ErrStepNotFound is returned when the step log has no row for a trip.
	ErrStepNotFound = errors.New("saga: step not found")
	// ErrFenced is the error of a company call not made because this
	// process is fenced: no liveness beat has committed for [FenceAfter].
	ErrFenced = errors.New("saga: fenced: this process's liveness is not confirmed by PostgreSQL")
)
