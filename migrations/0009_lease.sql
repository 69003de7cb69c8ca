-- Leases: a row per job that one paysvc at a time may run (the dead-letter
-- alerter's round, a reconcile run with --fix), taken and renewed by a
-- conditional update (sqldb.Lease). A row is a write every node of a
-- Galera or Percona XtraDB Cluster certifies, where GET_LOCK is local to
-- the node that grants it: two holders on two nodes would both get it.
-- expires_at is the holder's deadline (UTC, the server's clock): past it
-- another may take the lease. holder names the last holder (host, process,
-- a random token); the row is never deleted.
CREATE TABLE IF NOT EXISTS t_lease (
  name       VARCHAR(64)  NOT NULL,
  holder     VARCHAR(128) NOT NULL,
  expires_at DATETIME(3)  NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
