// Package schema (directory sql/) holds every table, function and view of streamd as
// .sql files embedded into the binary, and applies them. All objects live in the
// PostgreSQL schema "streamd".
//
// # Two layers
//
// Migrate applies the versioned migrations in sql/migrations once each, in version
// order, then re-applies every file of sql/functions and then sql/views (in name
// order, CREATE OR REPLACE) whenever the text of any of them changed. It runs under a
// session advisory lock, so two concurrent runs are safe: the second waits for the
// first and then finds nothing to do. The pending migrations and the re-applied files
// commit in one transaction. A failure names the file that failed
// ("apply functions/0300_messages.sql: ...", "apply migrations/0012_x.sql: ...") and
// leaves nothing of that run applied.
//
// # What each change requires
//
//   - A function's or a view's body changes: edit its file in sql/functions or
//     sql/views. It is re-applied on the next migrate; nothing else is needed.
//   - A function's signature changes (arguments, or a result type CREATE OR REPLACE
//     cannot change) or a function or view is removed: the new text goes in its file,
//     and a new migration DROPs the old one (DROP FUNCTION IF EXISTS
//     streamd.f(old argument types)). Not a DROP kept forever at the top of the
//     functions file: that runs on every change of any function, and hides which
//     schema version the old object belonged to. TestNoForgottenFunctions fails when
//     the database holds a streamd function that no file defines.
//   - A new table, column, constraint or index: a new migration. Write indexes and
//     columns with IF NOT EXISTS, so that an operator can build a large index
//     CONCURRENTLY (which cannot run inside the migration's transaction) before
//     upgrading, and the migration then skips it.
//   - Objects that DDL depends on (a function used by a column default, a CHECK, a
//     policy or a trigger created in a migration, a type): a migration, before the
//     DDL that uses it. The re-applied layer runs after the migrations, so DDL cannot
//     depend on it; such a function may still be re-created (CREATE OR REPLACE, same
//     signature) in a functions file.
//
// A migration's number is never reused or changed once committed: databases record
// the numbers they applied. Numbers are handed out in ranges to work done in parallel
// (each branch takes the next numbers of its own range), so a gap is normal: Migrate
// applies whatever is missing in order and does not need consecutive numbers.
// Migration 0005 is such a gap: 0004 to 0007 went to parallel branches on the first
// day, which committed out of order (git log -- sql/migrations: the coordinator's 0007
// at 05:23, the tailer's 0006 at 05:25, retention's 0004 at 05:26), and no commit ever
// added a 0005 (git log --all -- 'sql/migrations/0005*' is empty): the branch it was
// kept for needed none.
package schema
