# The zsched image. The entrypoint is `zsched`, so the container's command is a subcommand:
#   docker run IMAGE scheduler --metrics-port 9100 --metrics-host 0.0.0.0
#   docker run IMAGE worker scheduler.shell.demo:worker
#   docker run IMAGE schedule --at +1m --queue emails --payload '{"to": "a@example.com"}'
# Settings come from ZSCHED_REDIS_URL, ZSCHED_ETCD_ENDPOINTS, ZSCHED_NAMESPACE (or the flags).
# Your own handlers: build FROM this image and COPY your package into /app (the working
# directory, which `zsched worker MODULE:ATTR` imports from) or pip install it.
# EXTRAS: the optional parts installed with it; the default, ui, lets one image run the console
# too (deploy/kubernetes/console.yaml). `docker build --build-arg EXTRAS= .` leaves the console out.
FROM python:3.11-slim

ARG EXTRAS=ui

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A regular (not editable) install; the sources are removed afterwards so only the installed
# package is importable (a stray ./scheduler would shadow it for `zsched worker`).
COPY pyproject.toml README.md /src/
COPY lua /src/lua
COPY scheduler /src/scheduler
COPY workers /src/workers
RUN pip install "/src${EXTRAS:+[$EXTRAS]}" \
    && rm -rf /src \
    && useradd --system --create-home --uid 10001 zsched

WORKDIR /app
USER zsched
# metrics, when --metrics-port 9100 --metrics-host 0.0.0.0 is given
EXPOSE 9100
ENTRYPOINT ["zsched"]
CMD ["--help"]
