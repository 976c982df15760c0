-- Reserved for the specs migration, filled in by the change that introduces it.
SELECT 1;
