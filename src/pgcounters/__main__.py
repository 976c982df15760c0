from pgcounters.cli import main

main()
