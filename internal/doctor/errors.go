package doctor

import "errors"

// ErrViolation is wrapped by [Err] when there are findings: the live
// configuration breaks a guarantee, and a service must not start on it.
var ErrViolation = errors.New("configuration breaks the guarantees")
