-- paysvc schema. Runs on MariaDB 10.11 and MySQL 8: no vendor-only SQL.
-- Amounts are DECIMAL(18,2); flows are signed (a deduction is negative).

CREATE TABLE IF NOT EXISTS t_order (
  id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  order_no    VARCHAR(64)     NOT NULL,
  user_id     BIGINT          NOT NULL,
  amount      DECIMAL(18,2)   NOT NULL,
  status      VARCHAR(16)     NOT NULL DEFAULT 'INIT',
  pay_time    DATETIME(3)     NULL,
  create_time DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  update_time DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_order_no (order_no),
  KEY idx_user_id (user_id),
  CONSTRAINT ck_order_status CHECK (status IN ('INIT', 'PAID', 'SETTLED', 'REFUNDED')),
  CONSTRAINT ck_order_amount CHECK (amount > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_account (
  user_id     BIGINT        NOT NULL,
  balance     DECIMAL(18,2) NOT NULL DEFAULT 0,
  update_time DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (user_id),
  CONSTRAINT ck_account_balance CHECK (balance >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS t_account_flow (
  id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  user_id     BIGINT          NOT NULL,
  amount      DECIMAL(18,2)   NOT NULL,
  biz_no      VARCHAR(80)     NOT NULL,
  type        VARCHAR(32)     NOT NULL,
  remark      VARCHAR(255)    NOT NULL DEFAULT '',
  create_time DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  UNIQUE KEY uk_biz_no_type (biz_no, type),
  KEY idx_user_id (user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
