package saga

import "errors"

var (
	// ErrInvalidConfig is wrapped by [New] for a bad Config.
	ErrInvalidConfig = errors.New("saga: invalid config")
	// ErrStepNotFound is returned when the step log has no row for a trip.
	ErrStepNotFound = errors.New("saga: step not found")
)
