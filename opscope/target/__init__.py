"""What to run and how: the user's model file, the kind of job, and the supervised child process."""
