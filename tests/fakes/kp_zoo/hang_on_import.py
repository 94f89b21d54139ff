"""Never finishes importing (like a library waiting on a lock or a driver)."""

import time

while True:
    time.sleep(1)
