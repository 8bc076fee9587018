from worker.main import main

main()
