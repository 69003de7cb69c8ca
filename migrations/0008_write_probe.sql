-- The write probe: a row per paysvc instance that the consumer upserts, in
-- one transaction with a no-op write on each payment table, when payments
-- time out while MySQL answers reads. A probe that does not commit within
-- its bound means MySQL does not commit writes (a global read lock, a
-- metadata lock, a full disk, a semi-synchronous wait): an outage, which
-- pauses consumption instead of spending attempts (docs/design.md, "Write
-- stalls"). One row per instance name: a few hundred bytes.
CREATE TABLE IF NOT EXISTS t_write_probe (
  instance  VARCHAR(64) NOT NULL,
  probed_at DATETIME(3) NOT NULL,
  PRIMARY KEY (instance)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
