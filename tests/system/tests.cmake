# One line per system test: taskgrid_system_test(<name> <file.py>)
taskgrid_system_test(cli cli_test.py)
taskgrid_system_test(restart restart_test.py)
taskgrid_system_test(binaries binaries_test.py)
