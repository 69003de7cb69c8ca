-- Marking a notice SENT used to change its row's length ('PENDING' to
-- 'SENT', a NULL sent_time to a time), so InnoDB moved the row inside its
-- page and reorganised the page every few marks: about 2.3 KB of redo per
-- notice on MariaDB 10.11, more than the payment's own writes. With a
-- fixed-length status and a NOT NULL sent_time the mark rewrites the row in
-- place (about 0.2 KB). sent_time counts only when status is SENT; a notice
-- not sent yet holds '1000-01-01 00:00:00'.
-- The ALTER copies the table: on a large t_outbox, payments wait (in the
-- queue, nothing lost) until it finishes; see docs/operations.md.
-- The default first (a change of metadata only): pods of the previous image,
-- still paying during the migration, insert notices without sent_time, and
-- a NULL written between the UPDATE and the MODIFY would make the MODIFY
-- fail.
ALTER TABLE t_outbox ALTER COLUMN sent_time SET DEFAULT '1000-01-01 00:00:00';
UPDATE t_outbox SET sent_time = '1000-01-01 00:00:00' WHERE sent_time IS NULL;
ALTER TABLE t_outbox
  MODIFY status    CHAR(7) CHARACTER SET ascii NOT NULL DEFAULT 'PENDING',
  MODIFY sent_time DATETIME(3) NOT NULL DEFAULT '1000-01-01 00:00:00';
