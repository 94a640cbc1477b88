package events

import "errors"

var (
	// ErrInvalidEvent is returned when a message is not a valid CloudEvent
	// of ours: missing or malformed attributes, bad percent-encoding, data
	// that does not decode. Such a message is parked, never retried.
	ErrInvalidEvent = errors.New("events: invalid event")
	// ErrUnknownType is returned for an event type the catalogue does not
	// declare. Such a message is parked, never retried.
	ErrUnknownType = errors.New("events: unknown event type")
	// ErrInvalidCatalogue is returned by [Catalogue.Validate].
	ErrInvalidCatalogue = errors.New("events: invalid catalogue")
)
