-- Operations: dead letters kept for audit and replay, the payment-success
-- outbox, per-order events for `paysvc trace`, and known opening balances for
-- reconciliation.

CREATE TABLE IF NOT EXISTS t_dead_letter (
  id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  dedup_key        VARCHAR(100)    NOT NULL,
  order_no         VARCHAR(64)     NULL,
  user_id          BIGINT          NULL,
  amount           DECIMAL(18,2)   NULL,
  body             MEDIUMBLOB      NOT NULL,
  headers          TEXT            NOT NULL,
  error_class      VARCHAR(32)     NOT NULL,
  last_error       TEXT            NOT NULL,
  retry_count      INT             NOT NULL DEFAULT 0,
  parked_count     INT             NOT NULL DEFAULT 1,
  fingerprint      CHAR(64)        NOT NULL,
  first_failed_at  DATETIME(3)     NOT NULL,
  last_failed_at   DATETIME(3)     NOT NULL,
  status           VARCHAR(16)     NOT NULL DEFAULT 'NEW',
  updated_by       VARCHAR(64)     NOT NULL DEFAULT 'paysvc',
  reason           VARCHAR(255)    NOT NULL DEFAULT '',
  alerted_at       DATETIME(3)     NULL,
  create_time      DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  update_time      DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_dedup_key (dedup_key),
  KEY idx_status_class (status, error_class),
  KEY idx_last_failed_at (last_failed_at),
  KEY idx_order_no (order_no),
  CONSTRAINT ck_dead_letter_status CHECK (status IN ('NEW', 'REPLAYED', 'DISCARDED'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_dead_letter_event (
  id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  dead_letter_id  BIGINT UNSIGNED NOT NULL,
  event           VARCHAR(16)     NOT NULL,
  operator        VARCHAR(64)     NOT NULL,
  reason          VARCHAR(255)    NOT NULL DEFAULT '',
  result          TEXT            NOT NULL,
  error_class     VARCHAR(32)     NOT NULL DEFAULT '',
  retry_count     INT             NOT NULL DEFAULT 0,
  create_time     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_dead_letter_id (dead_letter_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_outbox (
  id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  event_type      VARCHAR(32)     NOT NULL,
  biz_no          VARCHAR(80)     NOT NULL,
  payload         TEXT            NOT NULL,
  status          VARCHAR(16)     NOT NULL DEFAULT 'PENDING',
  attempts        INT             NOT NULL DEFAULT 0,
  next_attempt_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  last_error      VARCHAR(1024)   NOT NULL DEFAULT '',
  create_time     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  sent_time       DATETIME(3)     NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_biz_no_event (biz_no, event_type),
  KEY idx_pending (status, next_attempt_at),
  CONSTRAINT ck_outbox_status CHECK (status IN ('PENDING', 'SENT'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_payment_event (
  id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  order_no     VARCHAR(64)     NOT NULL,
  event        VARCHAR(16)     NOT NULL,
  error_class  VARCHAR(32)     NOT NULL DEFAULT '',
  attempt      INT             NOT NULL DEFAULT 0,
  detail       VARCHAR(1024)   NOT NULL DEFAULT '',
  instance     VARCHAR(128)    NOT NULL DEFAULT '',
  create_time  DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_order_no (order_no, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_account_opening (
  user_id      BIGINT        NOT NULL,
  balance      DECIMAL(18,2) NOT NULL,
  as_of        DATETIME(3)   NOT NULL,
  create_time  DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
