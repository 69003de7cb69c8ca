-- Sessions of the admin pages, one row per sign-in, shared by every replica:
-- the cookie holds a random token, the row its SHA-256. A session ends when
-- it expires, when its operator signs out or is revoked, or when the
-- operator is no longer configured.
CREATE TABLE IF NOT EXISTS t_admin_session (
  id          CHAR(64)     NOT NULL,
  operator    VARCHAR(64)  NOT NULL,
  created_at  DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  expires_at  DATETIME(3)  NOT NULL,
  revoked_at  DATETIME(3)  NULL,
  revoked_by  VARCHAR(64)  NOT NULL DEFAULT '',
  PRIMARY KEY (id),
  KEY idx_operator (operator)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
