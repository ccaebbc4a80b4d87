-- Nothing to undo: migration 1 creates the table with both columns, and
-- its down migration drops the table.
DO 0;
