import Worker

/// The chat backend's tables, compiled in. `chat-backend migrate` applies them after the
/// worker's own and records them as the set `chat-backend`; numbers start at 1 and never
/// collide with the worker's. Never edit an applied migration: add the next one.
public let chatMigrations = MigrationSet(name: "chat-backend", migrations: [
    Migration(version: 1, name: "0001_devices_and_rooms", sql: """
        CREATE TABLE devices (
            token         text PRIMARY KEY,
            user_id       text NOT NULL,
            platform      text NOT NULL,
            registered_at timestamptz NOT NULL
        );
        CREATE INDEX devices_user ON devices (user_id);

        CREATE TABLE room_members (
            room    text NOT NULL,
            user_id text NOT NULL,
            PRIMARY KEY (room, user_id)
        );
        """),
    Migration(version: 2, name: "0002_chat_messages", sql: """
        CREATE TABLE chat_messages (
            message_id text PRIMARY KEY,
            room       text NOT NULL,
            sender     text NOT NULL,
            body       text NOT NULL,
            sent_at    timestamptz NOT NULL
        );
        CREATE INDEX chat_messages_room ON chat_messages (room, sent_at);
        """),
])
