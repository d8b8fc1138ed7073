from ksearch.cli import main

main()
