-- SENDER_ID_MISMATCH no longer marks a token: FCM answers it when the credentials send for
-- another project than the token's app, which says nothing about the token (Google lists only
-- UNREGISTERED and a token-format INVALID_ARGUMENT as reasons to drop one). Tokens an earlier
-- release marked 'unregistered' for it are restored: rows to them are sent again.
DELETE FROM device_tokens WHERE state = 'unregistered' AND error_code = 'SENDER_ID_MISMATCH';
