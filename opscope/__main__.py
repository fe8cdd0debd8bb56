from opscope.cli import main

main()
