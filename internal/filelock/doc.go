// Package filelock serialises work across processes with an exclusive lock
// on a file (flock on Unix):
//
//	l, err := filelock.Acquire(ctx, path)
//	if err != nil {
//		return err
//	}
//	defer l.Close()
//
// [Lock.Close] releases the lock; so does the operating system when the
// process exits, so a crashed holder never blocks others. [Acquire] waits
// for as long as ctx allows. Give ctx a deadline with
// [context.WithTimeoutCause] to say in the error why the wait ended.
//
// Locks conflict between open files, not between processes, so two
// goroutines of one process that each call Acquire exclude each other too.
// The lock file is created when missing and never removed: removing it
// would let two processes lock different files of the same name.
package filelock
