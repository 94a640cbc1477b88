-- +goose Up
-- trip_view: the reconciler's projection of every trip, built from every
-- service's events (TRIPS, HOTEL, PAYMENT, CAR). seen is the sorted set of
-- event kinds seen ("hotel.held"), so the row is the same whatever order
-- the events arrive in; status is derived from seen by the same rule as the
-- trips service (trips.Project), except that a trip.confirmed or
-- trip.canceled event settles it (settled). Times are the events' own
-- CloudEvents times, so a replay rebuilds the same rows.
CREATE TABLE trip_view (
    trip_id        text        PRIMARY KEY,
    seen           text[]      NOT NULL DEFAULT '{}',
    status         text        NOT NULL,             -- pending | confirmed | canceling | canceled
    settled        text,                             -- confirmed | canceled, from trip.* events; NULL until then
    requested      boolean     NOT NULL DEFAULT false, -- trip.requested seen
    mailed         boolean     NOT NULL DEFAULT false, -- mail.sent seen
    events         integer     NOT NULL DEFAULT 0,     -- distinct events applied
    first_event_at timestamptz NOT NULL,
    last_event_at  timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX trip_view_newest ON trip_view (first_event_at DESC, trip_id DESC);
CREATE INDEX trip_view_status ON trip_view (status);

-- +goose Down
DROP TABLE trip_view;
