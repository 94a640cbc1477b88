#!/usr/bin/env bash
# Makes tripsaga's PostgreSQL roles, as internal/pgroles does for `tripsaga
# up` and the tests: one login role per service, owning the schema of its
# name and nothing else, and "sim" (the company simulators), which makes
# its own sim_* schemas. PUBLIC keeps nothing on the database or on schema
# public. The postgres image runs this once, when it initialises its
# volume (/docker-entrypoint-initdb.d), as POSTGRES_USER on POSTGRES_DB.
#
# Each role's password is the variable TRIPSAGA_PASSWORD_<ROLE> (upper
# case) of the postgres container; compose.yaml gives every process the
# URL of its own role. cmd/tripsaga/compose_test.go checks that ROLES is
# pgroles.Default() and that every password matches its process's URL.
set -euo pipefail

# The services' roles (pgroles.Default(), without sim).
ROLES="hotel insurance payment car trips reconciler"

psql=(psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -v db="$POSTGRES_DB")

"${psql[@]}" <<'SQL'
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
REVOKE ALL ON SCHEMA public FROM PUBLIC;
SQL

make_role() { # role password
  "${psql[@]}" -v role="$1" -v pw="$2" <<'SQL'
CREATE ROLE :"role" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT PASSWORD :'pw';
GRANT CONNECT ON DATABASE :"db" TO :"role";
SQL
}

password() { # role: the value of TRIPSAGA_PASSWORD_<ROLE>
  local var="TRIPSAGA_PASSWORD_${1^^}"
  if [ -z "${!var:-}" ]; then
    echo "init-roles.sh: $var is not set (the password of role $1)" >&2
    exit 1
  fi
  printf '%s' "${!var}"
}

for role in $ROLES; do
  make_role "$role" "$(password "$role")"
  "${psql[@]}" -v role="$role" <<'SQL'
CREATE SCHEMA :"role" AUTHORIZATION :"role";
SQL
done

make_role sim "$(password sim)"
"${psql[@]}" <<'SQL'
GRANT CREATE ON DATABASE :"db" TO sim;
SQL
