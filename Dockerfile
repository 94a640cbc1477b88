# The one tripsaga binary; compose.yaml runs it once per process.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/tripsaga ./cmd/tripsaga

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/tripsaga /tripsaga
ENTRYPOINT ["/tripsaga"]
