# The two commands: `make demo` and `make test`. Both run `make setup` first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: setup bytecode system-packages browser-packages demo test bench compare lint clean test-faults test-spark test-rabbitmq test-redis-ha soak faults-report docs \
	ring-experiment scale-out bench-analysis bench-polite bench-memory

setup: system-packages $(STAMP) bytecode

# The project's own modules compiled once here, as pip compiles what it installs: every worker process
# would otherwise compile them again at each start (this environment may forbid writing bytecode).
PACKAGES := vcrawl telemetry tasks cluster views batch_analysis engine fetchers analyzers storage frontier api cli
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 $(PACKAGES) celeryconfig.py >/dev/null

# Debian's python3 has no venv module without python3-venv; redis-server is a system package.
# PostgreSQL: the records tests start a private server (tests/postgres.py); Debian keeps initdb
# off PATH, in /usr/lib/postgresql/<version>/bin. Java: Spark's runtime (vcrawl analyze --engine spark).
# RabbitMQ: the broker tests start private nodes (tests/rabbitmq.py); .ci/apt-install starts no service.
system-packages:
	@need=""; \
	command -v redis-server >/dev/null || need="$$need redis-server"; \
	compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null || need="$$need postgresql"; \
	test -x $(PY) || $(PYTHON) -c "import ensurepip, venv" 2>/dev/null || need="$$need python3-venv"; \
	command -v java >/dev/null || test -x "$$JAVA_HOME/bin/java" || need="$$need openjdk-17-jre-headless"; \
	test -x /usr/lib/rabbitmq/bin/rabbitmq-server || need="$$need rabbitmq-server"; \
	.ci/apt-install $$need

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,spark]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/vcrawl demo

# The browser tests need Debian's Chromium and its driver (CI installs them too, in .ci/run).
browser-packages:
	@need=""; \
	command -v chromium >/dev/null || need="$$need chromium"; \
	command -v chromedriver >/dev/null || need="$$need chromium-driver"; \
	.ci/apt-install $$need

# Two processes (pytest-xdist), each with its own Redis and worker; a file's tests stay together.
test: setup browser-packages
	@$(PY) -m pytest -n 2 --dist loadfile $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests; that is a failure here"; fi; exit $$rc

# Workers SIGKILLed, Redis restarted, hosts going down, hostile sites: real processes, ~2 minutes.
test-faults: setup
	@$(PY) -m pytest -n 2 --dist loadfile -m 'faults and not long and not rabbitmq' tests/faults tests/integration/test_hostile_sites.py; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-faults: pytest collected no tests; that is a failure here"; fi; exit $$rc

# The twins that wait real minutes at the shipped defaults (a cron minute, ten analysis retries' backoff).
# Batch analysis on a real Spark (local executors, a standalone master and worker): a JVM per run.
test-spark: setup
	@$(PY) -m pytest -n 2 --dist loadfile -m spark tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-spark: pytest collected no tests; that is a failure here"; fi; exit $$rc

# Celery's messages through RabbitMQ (private nodes on loopback): the fault tests' RabbitMQ half, a
# three-node quorum cluster, the ring, chords, beat, Flower and the API on it.
test-rabbitmq: setup
	@$(PY) -m pytest -n 2 --dist loadfile -m rabbitmq tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-rabbitmq: pytest collected no tests; that is a failure here"; fi; exit $$rc

# Redis past one server: Sentinels and failovers, replicas, the frontier on a Redis Cluster, Redis over
# TLS; each test starts its own group of redis-server processes on loopback.
test-redis-ha: setup
	@$(PY) -m pytest -n 2 --dist loadfile -m redis_ha tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-redis-ha: pytest collected no tests; that is a failure here"; fi; exit $$rc

test-long: setup
	@$(PY) -m pytest -n 2 --dist loadfile -m long tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-long: pytest collected no tests; that is a failure here"; fi; exit $$rc

# The fault suite again, printing what happened in each fault (pages, refetches, recovery time).
faults-report: setup
	@$(PY) tests/faults/report.py

bench: setup
	bench/run.sh

# vcrawl against Scrapy, Crawlee and the ceiling client, cases (a)-(e) of the performance table
# (about 15 minutes; (e) installs python3.11-doc); COMPARE_ARGS="--cases a e" for some of them.
COMPARE_ARGS ?=
compare: setup
	bench/run.sh compare $(COMPARE_ARGS)

# 20 concurrent jobs for 10 minutes: pages/s, worker RSS and Redis memory over time, full recall per
# job (bench/soak.py). About 12 minutes; SOAK_ARGS="--duration 90" for a short run.
SOAK_ARGS ?=
soak: setup
	bench/run.sh soak $(SOAK_ARGS)

# The host ring experiment (docs/scale-out.md): nodes A150 B80 C200 D40 on 200 hosts, C SIGKILLed, E300
# added; host and URL shares, hosts moved, recall and politeness. About 4 minutes; RING_ARGS=--quick.
RING_ARGS ?=
ring-experiment: setup
	bench/run.sh ring $(RING_ARGS)

# Pages/s, CPU, Redis commands and connections per page with 1, 2 and 4 worker nodes, ring and shared
# queue, politeness off and polite (docs/scale-out.md). About 10 minutes; SCALE_ARGS=--quick.
SCALE_ARGS ?=
scale-out: setup
	bench/run.sh scale $(SCALE_ARGS)

# A polite page against an impolite one on two plain workers (issue 35, docs/scale-out.md): pages/s, and
# Redis commands and CPU per page of the frontier's and the broker's Redis. About 2 minutes;
# POLITE_ARGS=--shared puts both on one Redis, as before VCRAWL_FRONTIER_URL.
POLITE_ARGS ?=
bench-polite: setup
	bench/run.sh polite $(POLITE_ARGS)

# Batch analysis throughput (docs/performance.md): a 6,000-page universe crawled once, then `vcrawl analyze
# --analyzer site-report` with 1 and 2 analysis processes, 3 runs each, near-duplicates once (bench/batch_analysis.py).
# About 7 minutes; ANALYSIS_ARGS="--runs 1 --no-near-duplicates" for a short run.
ANALYSIS_ARGS ?=
bench-analysis: setup
	bench/run.sh analysis $(ANALYSIS_ARGS)

# The frontier's Redis memory per queued and per seen URL, and how many URLs one 16 GiB Redis holds
# (issue 35, docs/scale-out.md): three polite jobs of 200,000 URLs over 1,000 hosts on a private
# redis-server, no workers (bench/frontier_memory.py). About a minute; MEMORY_ARGS="--urls 50000" for less.
MEMORY_ARGS ?=
bench-memory: setup
	bench/run.sh memory $(MEMORY_ARGS)

# The manual (docs/, Sphinx + MyST) with warnings as errors; its tools are the `docs` extra.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $(DOCS_STAMP)

docs: setup $(DOCS_STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -b html docs docs/_build/html
	@echo "make docs: docs/_build/html/index.html"

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) crawl-data .pytest_cache docs/_build
