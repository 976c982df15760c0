-- Reserved for the operations migration, filled in by the change that introduces it.
SELECT 1;
