package events

// The NATS identities are derived from this catalogue (natsauth):
// compose's server configuration and SECURITY.md's table are regenerated
// with the AsyncAPI document.
//go:generate go run ../natsauth/cmd/natsauth -root ..
