// Package inbox is the consuming half of the transactional outbox: an
// [Inbox] is a durable JetStream pull consumer that runs a handler inside a
// PostgreSQL transaction which also records the event's (source, id), so a
// redelivered or replayed event has no second effect; it acks only after
// the commit. Events the handler writes with outbox.Write are published by
// the process's relay right after that commit (Config.Relay).
//
// An event no handler can use (it does not decode, its type is unknown,
// the handler returns [ErrPermanent], or it failed MaxDeliver times) is
// parked: published to the dead-letter stream (events.StreamDeadLetter)
// with the reason, acked, and never blocks the events behind it;
// [RedriveParked] delivers it again through the same inbox.
//
// Rules followed, each a bug someone shipped (docs/how-it-works.md):
// the inbox row and the effect commit together; the consumer's position
// is stored beside the inbox rows (inbox_position), so a stream deleted
// and made again is noticed instead of skipped; MaxDeliver is enforced by
// the inbox, the server's consumer has MaxDeliver -1 (NATS docs:
// "JetStream Consumers", MaxDeliver and BackOff).
//
// Tables are unqualified: each service's pool sets search_path to its own
// schema (see the sql package).
package inbox
