-- The name FCM's HTTP v1 API gives a message it took (projects/…/messages/…), in a column of
-- its own for a row with one target (a token, topic or condition). It was kept in
-- token_results as {"TARGET": {"name": …}}, which repeats the target: a row's final version
-- then no longer fitted its page (filled to 40 % at insert) and about a fifth of the answers'
-- updates were not HOT, each writing a new entry in every index. A fan-out row
-- (registration_ids) keeps each token's answer in token_results, as legacy multicasts do.
-- A nullable column without a default: adding it rewrites nothing.
ALTER TABLE downstream_messages ADD COLUMN message_name text;
