package events

// The NATS identities are derived from this catalogue (internal/natsauth):
// compose's server configuration and SECURITY.md's table are regenerated
// with the AsyncAPI document.
//go:generate go run ../internal/natsauth/cmd/natsauth -root ..
