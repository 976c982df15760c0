-- Reserved for the quotas migration, filled in by the change that introduces it.
SELECT 1;
