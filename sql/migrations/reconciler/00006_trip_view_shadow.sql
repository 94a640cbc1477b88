-- +goose Up
-- trip_view_shadow: `tripsaga replay reconciler --shadow` rebuilds the
-- view here from every stream and compares it with trip_view, without
-- touching the live view.
CREATE TABLE trip_view_shadow (
    trip_id        text        PRIMARY KEY,
    seen           text[]      NOT NULL,
    status         text        NOT NULL,
    settled        text,
    events         integer     NOT NULL,
    first_event_at timestamptz NOT NULL,
    last_event_at  timestamptz NOT NULL
);

-- +goose Down
DROP TABLE trip_view_shadow;
