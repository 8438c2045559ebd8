-- The example's own table. Copy the project's migrations/ next to this file (or this file
-- into your migrations folder): one folder holds every migration, numbered in order.
CREATE TABLE devices (
    token         text PRIMARY KEY,
    platform      text NOT NULL,
    registered_at timestamptz NOT NULL
);
